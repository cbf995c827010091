"""The program the resume-at-another-world-size tests start under torchrun (2 or 3 ranks, gloo on CPU); the
tests also call :func:`run_phase` in their own process (a world of one).

    _world_size_script.py OUT PHASES [--source DIR]

Runs the comma-separated PHASES one after another in the same processes (the first Trainer starts the
process group, the later ones use it) and writes ``OUT/<phase>-rank<r>.json`` per rank (the samples each
epoch trained on this rank, the step and epoch reached, how often the run's events fired, the checkpoint
folder's manifests before and after) and ``OUT/<phase>-log-rank<r>.txt`` (drivetrain's log lines).

A phase is ``<driver>-<what>``, the driver ``ddp`` (``driver="torch"``), ``fsdp`` (``"torch_fsdp"``) or
``ds`` (``"deepspeed"``, ZeRO-2), the what:

- ``train``: ``N_EPOCHS`` epochs with ``CheckpointCallback(OUT/<driver>-ckpt, every_n_epochs=1)``;
- ``mid``: the same run ended by ``n_batches=MID_STEP`` inside epoch 2 (``MID_BATCHES`` of its batches),
  its ``last`` checkpoint in ``OUT/<driver>-mid-ckpt``;
- ``end``: resumed from ``--source``'s ``<driver>-ckpt`` with the same ``N_EPOCHS`` (nothing is left), with
  a CheckpointCallback on that folder again (which must write nothing);
- ``epoch``: resumed from ``--source``'s ``<driver>-ckpt`` with ``n_epochs=N_EPOCHS + 1``;
- ``rest``: resumed from ``--source``'s ``<driver>-mid-ckpt`` with ``N_EPOCHS``: the rest of epoch 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from drivetrain import Callback, CheckpointCallback, Trainer  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # torchrun runs this file by path
from _ddp_script import Points  # noqa: E402
from _fsdp_script import Net  # noqa: E402  (blocks FSDP shards one by one)

torch.set_num_threads(1)

N_TRAIN, BATCH_PER_RANK, N_EPOCHS = 100, 4, 2
MID_BATCHES = 4  # batches of epoch 2 the ``mid`` run trains at 2 ranks (13 per epoch there)
DRIVERS = {"ddp": "torch", "fsdp": "torch_fsdp", "ds": "deepspeed"}


def batches_per_epoch(world: int, samples: int = N_TRAIN) -> int:
    return -(-samples // (BATCH_PER_RANK * world))


MID_STEP = batches_per_epoch(2) + MID_BATCHES


class Recorder(Callback):
    """The samples each epoch trained on this rank, and how often the run's events fired."""

    def __init__(self) -> None:
        self.seen: dict[str, list[int]] = {}
        self.idx: dict[str, list[int]] = {}  # the same read from the batches themselves
        self.counts = {"on_train_begin": 0, "on_train_epoch_begin": 0, "on_train_epoch_end": 0, "on_train_end": 0}

    def on_train_batch_begin(self, trainer, batch, indices) -> None:
        self.seen.setdefault(str(trainer.cur_epoch_idx), []).extend(int(i) for i in indices)
        self.idx.setdefault(str(trainer.cur_epoch_idx), []).extend(batch["idx"].tolist())

    def on_train_begin(self, trainer) -> None:
        self.counts["on_train_begin"] += 1

    def on_train_epoch_begin(self, trainer) -> None:
        self.counts["on_train_epoch_begin"] += 1

    def on_train_epoch_end(self, trainer) -> None:
        self.counts["on_train_epoch_end"] += 1

    def on_train_end(self, trainer) -> None:
        self.counts["on_train_end"] += 1


def manifests(folder: str) -> dict[str, int]:
    """``{checkpoint name: its manifest.json's mtime in ns}`` of a CheckpointCallback folder."""
    if not os.path.isdir(folder):
        return {}
    return {name: os.stat(os.path.join(folder, name, "manifest.json")).st_mtime_ns
            for name in sorted(os.listdir(folder)) if os.path.isfile(os.path.join(folder, name, "manifest.json"))}


def run_phase(phase: str, out: str, source: str | None = None) -> dict:
    """Run ``phase`` (see the module's docstring), write its JSON and log, and return what it recorded."""
    name, what = phase.split("-", 1)
    rank = int(os.environ.get("RANK", "0"))
    handler = logging.FileHandler(os.path.join(out, f"{phase}-log-rank{rank}.txt"))
    handler.setFormatter(logging.Formatter("drivetrain: %(message)s"))
    logging.getLogger("drivetrain").addHandler(handler)
    try:
        return _run(phase, name, what, out, source)
    finally:
        logging.getLogger("drivetrain").removeHandler(handler)
        handler.close()


def _run(phase: str, name: str, what: str, out: str, source: str | None) -> dict:
    torch.manual_seed(0)
    model = Net()
    recorder = Recorder()
    callbacks: list = [recorder]
    options: dict = {"n_epochs": N_EPOCHS}
    resume_from = None
    folder = None
    if what == "train":
        folder = os.path.join(out, f"{name}-ckpt")
        callbacks.append(CheckpointCallback(folder, every_n_epochs=1))
    elif what == "mid":
        folder = os.path.join(out, f"{name}-mid-ckpt")
        callbacks.append(CheckpointCallback(folder))
        options["n_batches"] = MID_STEP
    else:
        assert source is not None, f"{phase} resumes from --source"
        resume_from = os.path.join(source, f"{name}-mid-ckpt" if what == "rest" else f"{name}-ckpt")
        if what == "end":
            folder = resume_from
            callbacks.append(CheckpointCallback(folder, every_n_epochs=1))
        elif what == "epoch":
            options["n_epochs"] = N_EPOCHS + 1
    if name == "ds":
        options["deepspeed_kwargs"] = {"zero_stage": 2}
    before = manifests(folder) if folder else {}
    train = DataLoader(Points(N_TRAIN, seed=0), batch_size=BATCH_PER_RANK, shuffle=True)
    trainer = Trainer(model, train, torch.optim.AdamW(model.parameters(), lr=0.01), driver=DRIVERS[name],
                      callbacks=callbacks, progress_bar=None, **options)
    trainer.run(num_eval_sanity_batch=0, resume_from=resume_from)
    d = trainer.driver
    result = {"rank": d.rank, "world_size": d.world_size, "driver": type(d).__name__, "seen": recorder.seen,
              "idx": recorder.idx,
              "counts": recorder.counts, "step": trainer.global_forward_batches, "epoch": trainer.cur_epoch_idx,
              "n_batches": trainer.n_batches, "manifests_before": before,
              "manifests_after": manifests(folder) if folder else {}}
    with open(os.path.join(out, f"{phase}-rank{d.rank}.json"), "w") as f:
        json.dump(result, f)
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("phases")
    parser.add_argument("--source")
    args = parser.parse_args()
    for phase in args.phases.split(","):
        run_phase(phase, args.out, args.source)
    print(f"rank-done {os.environ.get('RANK', '0')}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
