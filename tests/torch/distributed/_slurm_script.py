"""The program the Slurm tests start with ``srun -n 2`` (or ``nproc=2``), torch DDP on CPU (gloo).

    _slurm_script.py OUT [--nproc 2] [--slow SECONDS] [--single]

Trains a small MLP on fixed data for 2 epochs with a CheckpointCallback in ``OUT/ckpt`` and
``resume_from="latest"``; rank 0 writes the final parameters to ``OUT/final-<tag>.npz`` (``tag``: the job's
restart count, or ``nproc``) and every rank appends its rank, world size and steps trained to
``OUT/ranks.txt``. ``--slow`` sleeps after each batch (time for a preemption signal to arrive mid-run) and
writes ``OUT/started`` once training began; ``--single`` asks for ``driver="torch"`` with ``nproc=1`` (the
single-process driver, which a step of several tasks must refuse).
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")  # up to 8 processes share the test machine's cores

import numpy as np  # noqa: E402
import torch  # noqa: E402

from drivetrain import Callback, CheckpointCallback, Trainer  # noqa: E402

torch.manual_seed(0)


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": torch.nn.functional.cross_entropy(self.layers(x), y)}


class Slow(Callback):
    def __init__(self, seconds: float, out: str) -> None:
        self.seconds, self.out = seconds, out

    def on_train_batch_end(self, trainer) -> None:
        if trainer.driver.is_global_zero and trainer.global_forward_batches == 2:
            open(os.path.join(self.out, "started"), "w").close()
        time.sleep(self.seconds)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--nproc", type=int)
    parser.add_argument("--slow", type=float, default=0.0)
    args = parser.parse_args()
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(96, 6, generator=generator)
    y = torch.randint(0, 3, (96,), generator=generator)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8, shuffle=True)
    model = Net()
    callbacks = [CheckpointCallback(os.path.join(args.out, "ckpt"), every_n_batches=4)]
    if args.slow:
        callbacks.append(Slow(args.slow, args.out))
    trainer = Trainer(model, loader, torch.optim.SGD(model.parameters(), lr=0.1), driver="torch", n_epochs=2,
                      progress_bar=None, callbacks=callbacks, nproc=args.nproc)
    start = trainer.global_forward_batches
    trainer.run(resume_from="latest")
    with open(os.path.join(args.out, "ranks.txt"), "a") as f:
        f.write(f"{trainer.driver.rank} {trainer.driver.world_size} {start} {trainer.global_forward_batches}\n")
    if trainer.driver.is_global_zero:
        tag = os.environ.get("SLURM_RESTART_COUNT", "0") if args.nproc is None else f"nproc{args.nproc}"
        state = {k: v.detach().numpy() for k, v in model.state_dict().items()}
        np.savez(os.path.join(args.out, f"final-{tag}.npz"), **state)


if __name__ == "__main__":
    main()
