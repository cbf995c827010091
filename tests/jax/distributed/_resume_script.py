"""The program test_resume_world_sizes.py starts under drivetrain_jax's launcher (CPU), at 2 or 3 processes:

    python -m drivetrain_jax.run --nproc_per_node W _resume_script.py OUT PHASE[,PHASE...]

The phases and what each rank writes are those of ``tests/_resume_rule.py`` (framework-free); here only the run
they share: an MLP with dropout, SGD, ``PER_RANK`` samples per process and step, shuffled by drivetrain_jax's
framework-free ``DataLoader``.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))

import numpy as np  # noqa: E402
import optax  # noqa: E402
from flax import nnx  # noqa: E402

from drivetrain import Trainer, seed_everything  # noqa: E402
from drivetrain_jax import DataLoader  # noqa: E402
from tests._resume_rule import N_SAMPLES, PER_RANK, main  # noqa: E402


class Net(nnx.Module):
    def __init__(self) -> None:
        rngs = nnx.Rngs(0)
        self.linear1, self.linear2 = nnx.Linear(4, 8, rngs=rngs), nnx.Linear(8, 2, rngs=rngs)
        self.dropout = nnx.Dropout(0.2, rngs=rngs)

    def __call__(self, x, target, idx):
        logits = self.linear2(self.dropout(nnx.relu(self.linear1(x))))
        return {"loss": optax.softmax_cross_entropy_with_integer_labels(logits, target).mean(), "pred": logits}


def points() -> list[dict]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((N_SAMPLES, 4)).astype(np.float32)
    return [{"x": x[i], "target": np.int32(x[i, 0] > 0), "idx": np.int32(i)} for i in range(N_SAMPLES)]


def make_trainer(n_epochs: int, callbacks: list, **options) -> Trainer:
    seed_everything(5)
    model = Net()
    return Trainer(model, DataLoader(points(), batch_size=PER_RANK, shuffle=True),
                   nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param), driver="jax", n_epochs=n_epochs,
                   callbacks=callbacks, progress_bar=None, **options)


if __name__ == "__main__":
    main(sys.argv[1:], make_trainer, index_key="idx")
