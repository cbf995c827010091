"""What each rank runs in the elastic-restart test, under ``torchrun --nproc_per_node 2 --max-restarts 1``.

    _elastic_script.py OUT KILL_AT [DRIVER]

Trains ``_fsdp_script``'s model and data with DRIVER (``torch``: DDP, the default; ``torch_fsdp``: FSDP2
and ``deepspeed``: ZeRO-2, both with sharded checkpoints), a CheckpointCallback every 2 batches into
``OUT/ckpt`` and ``run(resume_from="latest")``. On the first attempt (no ``OUT/killed``
marker yet) rank 1 writes the marker and kills itself with SIGKILL after batch KILL_AT; torchrun then
restarts the whole group, which resumes from the newest checkpoint. Once that run ends, the same
processes train an unbroken run (no checkpoints), and rank 0 writes both final parameter sets and the
batch each attempt started from to ``OUT/result.json``.
"""

from __future__ import annotations

import json
import os
import signal
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")

import _fsdp_script as script  # noqa: E402 - the folder of this file is on sys.path when run as a script
import torch  # noqa: E402

from drivetrain import CheckpointCallback, Event  # noqa: E402

torch.set_num_threads(1)


def _kill_once(out: str, kill_at: int):
    def maybe_kill(trainer) -> None:
        marker = os.path.join(out, "killed")
        if trainer.driver.rank == 1 and trainer.global_forward_batches == kill_at and not os.path.exists(marker):
            with open(marker, "w") as f:
                f.write(str(kill_at))
            os.kill(os.getpid(), signal.SIGKILL)

    return maybe_kill


def _train(out: str, kill_at: int | None, driver: str) -> tuple[dict, int]:
    """One run; with ``kill_at``, the elastic one. Returns the final parameters and the batch it started from."""
    torch.manual_seed(0)
    callbacks = [CheckpointCallback(os.path.join(out, "ckpt"), every_n_batches=2)] if kill_at is not None else []
    trainer = script.build_trainer(script.Net(), batch_size=script.BATCH_PER_RANK, driver=driver,
                                   callbacks=callbacks)
    started: list[int] = []
    trainer.add_callback_fn(Event.on_train_begin(), lambda t: started.append(t.global_forward_batches))
    if kill_at is not None:
        trainer.add_callback_fn(Event.on_train_batch_end(), _kill_once(out, kill_at))
        trainer.run(num_eval_sanity_batch=0, resume_from="latest")
    else:
        trainer.run(num_eval_sanity_batch=0)
    return script.state_lists(trainer.driver.model_state()), started[0]


def main(out: str, kill_at: int, driver: str) -> None:
    elastic, started = _train(out, kill_at, driver)
    unbroken, _ = _train(out, None, driver)
    if int(os.environ["RANK"]) == 0:
        result = {"elastic": elastic, "unbroken": unbroken, "started": started,
                  "restart_count": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", -1))}
        with open(os.path.join(out, "result.json"), "w") as f:
            json.dump(result, f)
    print(f"rank-done {os.environ['RANK']}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else "torch")
