"""What does ``Trainer.run()`` cost over a hand-written torch loop?

Both sides train the same model from the same initial weights on the same
pre-generated batches (a list of ``{"x": tensor, "target": tensor}`` dicts), on the
CPU with one thread, with SGD, in the Trainer's order: forward, backward, step,
zero_grad(set_to_none=True). The hand loop and the Trainer run in alternating
rounds (hand, trainer, hand, trainer, ...) so that background load hits both
alike; each side reports its median over the rounds.

Workloads:

- W1: MLP 32->64->10 (Linear-ReLU-Linear, cross-entropy), batch size 32.
- W2: Linear 8->2 (MSE), batch size 8: so little compute that the per-step
  overhead of the loop itself (µs/step, trainer - hand) is what shows.

For each workload a Trainer with ``progress_bar="raw"`` (its lines sent to a
StringIO) is also timed, informationally, to show what a progress display costs.
Building the Trainer is not measured; ``run()`` is, whole.

Each run is measured in CPU time of this process (what the loop costs, whatever
else the machine is doing) and in wall time. On a shared machine both are noisy;
``--callgrind`` counts the instructions each loop executes instead, which is
deterministic (to ~0.1%) and so shows a change of a few hundred instructions per step:

    python bench/overhead.py [--steps N] [--rounds R] [--workload W1|W2|all] [--json PATH]
    valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file=/tmp/cg.out \
        python bench/overhead.py --callgrind /tmp/cg.out --rounds 1 --steps 1000

The framework-neutral machinery (rounds, meters, table, JSON) is in
``_overhead_harness.py``, shared with overhead_paddle.py and the other frameworks' files.
This is a measurement, not a test: nothing here asserts a timing.
"""

from __future__ import annotations

import copy
import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import torch  # noqa: E402 - after the thread settings
from _overhead_harness import SEED, Framework, Workload, main  # noqa: E402


class MLP(torch.nn.Module):
    """W1: Linear-ReLU-Linear with cross-entropy."""

    def __init__(self, n_in: int = 32, hidden: int = 64, n_out: int = 10) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(n_in, hidden)
        self.fc2 = torch.nn.Linear(hidden, n_out)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
        logits = self.fc2(torch.relu(self.fc1(x)))
        return {"loss": torch.nn.functional.cross_entropy(logits, target)}


class Regression(torch.nn.Module):
    """W2: a single Linear layer with MSE."""

    def __init__(self, n_in: int = 8, n_out: int = 2) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(n_in, n_out)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": torch.nn.functional.mse_loss(self.linear(x), target)}


def seeded(cls: type[torch.nn.Module]) -> torch.nn.Module:
    torch.manual_seed(SEED)
    return cls()


def w1_batches(steps: int) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(SEED)
    return [{"x": torch.randn(32, 32, generator=g), "target": torch.randint(0, 10, (32,), generator=g)}
            for _ in range(steps)]


def w2_batches(steps: int) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(SEED)
    return [{"x": torch.randn(8, 8, generator=g), "target": torch.randn(8, 2, generator=g)} for _ in range(steps)]


def prepare_hand(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    model.train()
    optimizer.zero_grad(set_to_none=True)


def hand_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: dict[str, torch.Tensor]) -> None:
    loss = model(batch["x"], batch["target"])["loss"]
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.equal(pa, pb) for pa, pb in zip(a.parameters(), b.parameters(), strict=True))


TORCH = Framework(
    name="torch",
    version=torch.__version__,
    driver="torch",
    workloads={
        "W1": Workload("MLP 32-64-10, CE, bs=32", lambda: seeded(MLP), w1_batches),
        "W2": Workload("Linear 8-2, MSE, bs=8", lambda: seeded(Regression), w2_batches),
    },
    copy_model=copy.deepcopy,
    make_optimizer=lambda model, lr: torch.optim.SGD(model.parameters(), lr=lr),
    hand_step=hand_step,
    prepare_hand=prepare_hand,
    same_weights=same_weights,
    setup_line="1 torch thread, ",
)

if __name__ == "__main__":
    torch.set_num_threads(1)
    sys.exit(main(TORCH, __doc__))
