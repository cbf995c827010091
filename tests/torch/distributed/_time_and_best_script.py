"""The program the time-and-best tests start under torchrun (2 ranks, DDP, gloo on CPU).

    _time_and_best_script.py OUT

One run, 3 epochs of 6 batches, evaluated every 4 batches, with two CheckpointCallbacks:
``every_n_seconds`` (rank 1's clock told to run 5 times as fast, so a rank deciding by its own clock would
save at nearly every batch while rank 0 saves every few) and ``topk=1`` on dev accuracy with ``load_best_model_at_end``. Each rank writes
``OUT/rank<r>.json``: the steps at which its periodic saves happened, the best folder, its model after the run.
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from drivetrain import Accuracy, Callback, CheckpointCallback, Trainer  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # torchrun runs this file by path
from _ddp_script import Net, Points  # noqa: E402

torch.set_num_threads(1)
BATCH_SECONDS = 0.06  # a compute stand-in: the periodic save is due every few batches
EVERY_SECONDS = 0.2


class SlowBatches(Callback):
    """Each batch takes BATCH_SECONDS; the steps at which the periodic callback wrote a checkpoint."""

    def __init__(self) -> None:
        self.saved_at: list[int] = []
        self.trained: dict = {}  # the model after the last batch, before the best one is loaded

    def on_train_batch_end(self, trainer) -> None:
        time.sleep(BATCH_SECONDS)
        if trainer.global_forward_batches == trainer.n_batches:
            self.trained = state_lists(trainer.model)

    def on_save_checkpoint(self, trainer) -> None:
        self.saved_at.append(trainer.global_forward_batches)


def state_lists(model: torch.nn.Module) -> dict[str, list[float]]:
    return {k: v.flatten().tolist() for k, v in model.state_dict().items()}


def main(out: str) -> None:
    rank = int(os.environ["RANK"])
    periodic = CheckpointCallback(os.path.join(out, "periodic"), every_n_seconds=EVERY_SECONDS, save_last=False)
    if rank == 1:
        periodic.clock = lambda: 5 * time.monotonic()  # type: ignore[method-assign]
    best = CheckpointCallback(os.path.join(out, "best"), topk=1, monitor="acc#acc#dev", save_last=False,
                              load_best_model_at_end=True)
    slow = SlowBatches()
    torch.manual_seed(0)
    model = Net()
    trainer = Trainer(model, DataLoader(Points(48, seed=0), batch_size=4, shuffle=True),
                      torch.optim.SGD(model.parameters(), lr=0.3), driver="torch", n_epochs=3, progress_bar=None,
                      evaluate_dataloaders={"dev": DataLoader(Points(40, seed=1), batch_size=8)},
                      metrics={"acc": Accuracy()}, evaluate_every=4, callbacks=[periodic, best, slow])
    trainer.run(num_eval_sanity_batch=0)
    record = {"saved_at": slow.saved_at, "periodic": sorted(os.listdir(periodic.folder)),
              "best": trainer.best_checkpoint, "evaluations": trainer.history["evaluate"],
              "trained": slow.trained, "model": state_lists(model)}
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(record, f)


if __name__ == "__main__":
    main(sys.argv[1])
