"""What does ``Trainer.run()`` cost over a hand-written jittor loop? (jittor's counterpart of overhead.py)

Both sides train the same model from the same initial weights on the same
pre-generated batches (a list of ``{"x": Var, "target": Var}`` dicts of jittor Vars),
on the CPU, with SGD. The hand loop is what a jittor user writes,
``optimizer.step(loss)`` (backward and step in one call); the Trainer does the same
work in its order: ``optimizer.backward(loss)``, ``optimizer.step()``,
``optimizer.zero_grad()``. jittor executes lazily: each backward first waits for the
previous step's updates, so at most one step is pending when a run ends, on both
sides. The hand loop and the Trainer run in alternating rounds so that background
load hits both alike; each side reports its median over the rounds, in CPU time of
this process and in wall time. Building the Trainer is not measured; ``run()`` is.

Workloads (as in overhead.py):

- W1: MLP 32->64->10 (Linear-ReLU-Linear, cross-entropy), batch size 32.
- W2: Linear 8->2 (MSE), batch size 8: so little compute that the per-step
  overhead of the loop itself (µs/step, trainer - hand) is what shows.

    python bench/overhead_jittor.py [--steps N] [--rounds R] [--workload W1|W2|all] [--json PATH]

The machinery (rounds, meters, table, JSON) is shared: ``_overhead_harness.py``.
This is a measurement, not a test: nothing here asserts a timing.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("log_silent", "1")  # jittor's info lines (compiler paths, op compilation)

import numpy as np  # noqa: E402

from drivetrain_jittor import import_jittor  # noqa: E402

jt = import_jittor()

from _overhead_harness import SEED, Framework, Workload, main  # noqa: E402


class MLP(jt.Module):
    """W1: Linear-ReLU-Linear with cross-entropy."""

    def __init__(self, n_in: int = 32, hidden: int = 64, n_out: int = 10) -> None:
        super().__init__()
        self.fc1 = jt.nn.Linear(n_in, hidden)
        self.fc2 = jt.nn.Linear(hidden, n_out)

    def execute(self, x, target):
        logits = self.fc2(jt.nn.relu(self.fc1(x)))
        return {"loss": jt.nn.cross_entropy_loss(logits, target)}


class Regression(jt.Module):
    """W2: a single Linear layer with MSE."""

    def __init__(self, n_in: int = 8, n_out: int = 2) -> None:
        super().__init__()
        self.linear = jt.nn.Linear(n_in, n_out)

    def execute(self, x, target):
        return {"loss": jt.nn.mse_loss(self.linear(x), target)}


def seeded(cls: type) -> jt.Module:
    jt.set_seed(SEED)
    return cls()


def w1_batches(steps: int) -> list[dict]:
    rng = np.random.default_rng(SEED)
    return [{"x": jt.array(rng.standard_normal((32, 32)).astype(np.float32)),
             "target": jt.array(rng.integers(0, 10, 32).astype(np.int32))} for _ in range(steps)]


def w2_batches(steps: int) -> list[dict]:
    rng = np.random.default_rng(SEED)
    return [{"x": jt.array(rng.standard_normal((8, 8)).astype(np.float32)),
             "target": jt.array(rng.standard_normal((8, 2)).astype(np.float32))} for _ in range(steps)]


def copy_model(initial: jt.Module) -> jt.Module:
    """A new instance of the same class holding ``initial``'s weights."""
    model = type(initial)()
    for name, var in model.state_dict().items():
        var.update(jt.array(initial.state_dict()[name].numpy()))
    return model


def prepare_hand(model: jt.Module, optimizer) -> None:
    model.train()
    optimizer.zero_grad()


def hand_step(model: jt.Module, optimizer, batch: dict) -> None:
    loss = model(batch["x"], batch["target"])["loss"]
    optimizer.step(loss)


def same_weights(a: jt.Module, b: jt.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return all(np.array_equal(sa[k].numpy(), sb[k].numpy()) for k in sa)


JITTOR = Framework(
    name="jittor",
    version=jt.__version__,
    driver="jittor",
    workloads={
        "W1": Workload("MLP 32-64-10, CE, bs=32", lambda: seeded(MLP), w1_batches),
        "W2": Workload("Linear 8-2, MSE, bs=8", lambda: seeded(Regression), w2_batches),
    },
    copy_model=copy_model,
    make_optimizer=lambda model, lr: jt.optim.SGD(model.parameters(), lr=lr),
    hand_step=hand_step,
    prepare_hand=prepare_hand,
    same_weights=same_weights,
    setup_line=f"OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}, ",
)

if __name__ == "__main__":
    sys.exit(main(JITTOR, __doc__))
