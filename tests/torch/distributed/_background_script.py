"""The program the background-save process tests start under torchrun (2 ranks, gloo on CPU).

    _background_script.py OUT DRIVER      (DRIVER: torch_fsdp, sharded; or torch, DDP with rank 0 writing)

Writes ``OUT/<driver>-rank<r>.json`` per rank:

- ``straight``: the parameters of an uninterrupted run;
- ``resumed``: the parameters of a run stopped after ``STOP_AT`` batches (its CheckpointCallback saving every 2
  batches with ``background=True``, keeping 2) and resumed from its folder; ``listing_after_stop``: that folder
  when the stopped run ended;
- ``failed``: a run whose background save of step 4 fails on one rank (rank 1 for the sharded save, rank 0,
  the writer, for DDP): the error each rank raised, the step it raised at, the folder (``keep_last_n=1``)
  after it, and whether the checkpoint left there verifies.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

from drivetrain import Callback, CheckpointCallback, EarlyStopException  # noqa: E402
from drivetrain._format import folder as folder_module  # noqa: E402
from drivetrain._format import read_checkpoint  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # torchrun runs this file by path
from _fsdp_script import Net, build_trainer, state_lists  # noqa: E402

torch.set_num_threads(1)
STOP_AT = 5
FAIL = "step_00000004-epoch_0-batch_4"


class StopAt(Callback):
    def __init__(self, at: int) -> None:
        self.at = at

    def on_train_batch_end(self, trainer) -> None:
        if trainer.global_forward_batches == self.at:
            raise EarlyStopException("interrupted on purpose")


def _trainer(driver: str, callbacks: list, seed: int = 0):
    torch.manual_seed(seed)
    return build_trainer(Net(), batch_size=4, driver=driver, callbacks=callbacks)


def _keeper(folder: str, keep: int = 2) -> CheckpointCallback:
    return CheckpointCallback(folder, every_n_batches=2, background=True, keep_last_n=keep, save_last=False)


def _listing(folder: str) -> list[str]:
    return sorted(n for n in os.listdir(folder) if n != ".drivetrain-run.lock")


def _fail_writes_of(name: str, sharded: bool) -> None:
    """Make this rank's writer fail for the checkpoint ``name`` (its shard file, or rank 0's whole files)."""
    if sharded:
        from drivetrain._checkpoint import sharded as module
        original = module._write_files
    else:
        module, original = folder_module, folder_module.write_files

    def failing(folder, tmp, files):
        if os.path.basename(folder) == name:
            raise OSError(28, f"could not write checkpoint {folder} (injected): No space left on device")
        return original(folder, tmp, files)

    if sharded:
        module._write_files = failing
    else:
        module.write_files = failing


def main() -> None:
    out, driver = sys.argv[1], sys.argv[2]
    rank = int(os.environ["RANK"])
    straight = _trainer(driver, [])
    straight.run()
    result: dict = {"straight": state_lists(straight.driver.model_state())}

    folder = os.path.join(out, f"{driver}-ckpt")
    _trainer(driver, [_keeper(folder), StopAt(STOP_AT)]).run()
    result["listing_after_stop"] = _listing(folder)
    resumed = _trainer(driver, [_keeper(folder)], seed=1)
    resumed.run(resume_from=folder)
    result["resumed"] = state_lists(resumed.driver.model_state())

    failing = os.path.join(out, f"{driver}-failing")
    if rank == (1 if driver == "torch_fsdp" else 0):
        _fail_writes_of(FAIL, sharded=driver == "torch_fsdp")
    trainer = _trainer(driver, [_keeper(failing, keep=1)])
    try:
        trainer.run()
        result["error"] = None
    except Exception as exc:
        cause = exc.__cause__ or exc
        result["error"] = f"{type(cause).__name__}: {cause}"
    result["failed_at"] = trainer.global_forward_batches
    result["failing_listing"] = _listing(failing)
    try:
        for name in _listing(failing):
            read_checkpoint(os.path.join(failing, name))
        result["intact"] = True
    except Exception as exc:
        result["intact"] = f"{type(exc).__name__}: {exc}"
    with open(os.path.join(out, f"{driver}-rank{rank}.json"), "w") as f:
        json.dump(result, f)
    print(f"rank-done {rank}", flush=True)


if __name__ == "__main__":
    main()
