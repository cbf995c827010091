"""What does ``Trainer.run()`` cost over a hand-written oneflow loop? (oneflow's counterpart of overhead.py)

Both sides train the same model from the same initial weights on the same
pre-generated batches (a list of ``{"x": tensor, "target": tensor}`` dicts of oneflow
tensors), on the CPU, with SGD, in the Trainer's order: forward, backward, step,
``zero_grad()`` (in place, oneflow's default). The hand loop and the Trainer run in
alternating rounds so that background load hits both alike; each side reports its
median over the rounds, in CPU time of this process and in wall time. Building the
Trainer is not measured; ``run()`` is, whole.

Workloads (as in overhead.py):

- W1: MLP 32->64->10 (Linear-ReLU-Linear, cross-entropy), batch size 32.
- W2: Linear 8->2 (MSE), batch size 8: so little compute that the per-step
  overhead of the loop itself (µs/step, trainer - hand) is what shows.

Runs on Python 3.10 with oneflow 0.9.0 (``.venv-oneflow`` or ``tox -e oneflow``):

    .venv-oneflow/bin/python bench/overhead_oneflow.py [--steps N] [--rounds R] [--workload W1|W2|all] [--json PATH]

The machinery (rounds, meters, table, JSON) is shared: ``_overhead_harness.py``.
This is a measurement, not a test: nothing here asserts a timing.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("GLOG_minloglevel", "2")

import numpy as np  # noqa: E402
import oneflow as flow  # noqa: E402
from _overhead_harness import SEED, Framework, Workload, main  # noqa: E402


class MLP(flow.nn.Module):
    """W1: Linear-ReLU-Linear with cross-entropy."""

    def __init__(self, n_in: int = 32, hidden: int = 64, n_out: int = 10) -> None:
        super().__init__()
        self.fc1 = flow.nn.Linear(n_in, hidden)
        self.fc2 = flow.nn.Linear(hidden, n_out)

    def forward(self, x, target):
        logits = self.fc2(flow.relu(self.fc1(x)))
        return {"loss": flow.nn.functional.cross_entropy(logits, target)}


class Regression(flow.nn.Module):
    """W2: a single Linear layer with MSE."""

    def __init__(self, n_in: int = 8, n_out: int = 2) -> None:
        super().__init__()
        self.linear = flow.nn.Linear(n_in, n_out)

    def forward(self, x, target):
        return {"loss": flow.nn.functional.mse_loss(self.linear(x), target)}


def seeded(cls: type[flow.nn.Module]) -> flow.nn.Module:
    flow.manual_seed(SEED)
    return cls()


def w1_batches(steps: int) -> list[dict[str, flow.Tensor]]:
    rng = np.random.default_rng(SEED)
    return [{"x": flow.tensor(rng.standard_normal((32, 32)).astype(np.float32)),
             "target": flow.tensor(rng.integers(0, 10, 32))} for _ in range(steps)]


def w2_batches(steps: int) -> list[dict[str, flow.Tensor]]:
    rng = np.random.default_rng(SEED)
    return [{"x": flow.tensor(rng.standard_normal((8, 8)).astype(np.float32)),
             "target": flow.tensor(rng.standard_normal((8, 2)).astype(np.float32))} for _ in range(steps)]


def copy_model(initial: flow.nn.Module) -> flow.nn.Module:
    """A new instance of the same class holding ``initial``'s weights."""
    model = type(initial)()
    model.load_state_dict({k: flow.tensor(v.numpy()) for k, v in initial.state_dict().items()})
    return model


def prepare_hand(model: flow.nn.Module, optimizer) -> None:
    model.train()
    optimizer.zero_grad()


def hand_step(model: flow.nn.Module, optimizer, batch: dict[str, flow.Tensor]) -> None:
    loss = model(batch["x"], batch["target"])["loss"]
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def same_weights(a: flow.nn.Module, b: flow.nn.Module) -> bool:
    return all(np.array_equal(pa.numpy(), pb.numpy()) for pa, pb in zip(a.parameters(), b.parameters(), strict=True))


ONEFLOW = Framework(
    name="oneflow",
    version=flow.__version__,
    driver="oneflow",
    workloads={
        "W1": Workload("MLP 32-64-10, CE, bs=32", lambda: seeded(MLP), w1_batches),
        "W2": Workload("Linear 8-2, MSE, bs=8", lambda: seeded(Regression), w2_batches),
    },
    copy_model=copy_model,
    make_optimizer=lambda model, lr: flow.optim.SGD(model.parameters(), lr=lr),
    hand_step=hand_step,
    prepare_hand=prepare_hand,
    same_weights=same_weights,
    setup_line=f"OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}, ",
)

if __name__ == "__main__":
    sys.exit(main(ONEFLOW, __doc__))
