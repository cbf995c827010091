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

    python bench/overhead.py [--steps N] [--rounds R] [--workload W1|W2|all] [--json PATH]

This is a measurement, not a test: nothing here asserts a timing.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import io
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import torch  # noqa: E402 - after the thread settings

from drivetrain import Trainer  # noqa: E402

SEED = 0
LR = 0.01


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


def make_w1_batches(steps: int) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(SEED)
    return [{"x": torch.randn(32, 32, generator=g), "target": torch.randint(0, 10, (32,), generator=g)}
            for _ in range(steps)]


def make_w2_batches(steps: int) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(SEED)
    return [{"x": torch.randn(8, 8, generator=g), "target": torch.randn(8, 2, generator=g)} for _ in range(steps)]


WORKLOADS: dict[str, dict[str, Any]] = {
    "W1": {"describe": "MLP 32-64-10, CE, bs=32", "model": MLP, "batches": make_w1_batches},
    "W2": {"describe": "Linear 8-2, MSE, bs=8", "model": Regression, "batches": make_w2_batches},
}


# ------------------------------------------------------------------ the two sides
Timing = tuple[float, float]  # (wall seconds, CPU seconds of this process)


def hand_loop(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batches: list[dict]) -> Timing:
    """The reference: what a user would write by hand."""
    model.train()
    optimizer.zero_grad(set_to_none=True)
    start, cpu_start = time.perf_counter(), time.process_time()
    for batch in batches:
        loss = model(batch["x"], batch["target"])["loss"]
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - start, time.process_time() - cpu_start


def trainer_loop(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batches: list[dict],
                 progress_bar: Any = None) -> Timing:
    """The same training through ``Trainer.run()``; building the Trainer is not timed."""
    trainer = Trainer(model, batches, optimizer, driver="torch", device="cpu", n_epochs=1,
                      progress_bar=progress_bar)
    with contextlib.redirect_stdout(io.StringIO()):
        start, cpu_start = time.perf_counter(), time.process_time()
        trainer.run()
        elapsed = time.perf_counter() - start, time.process_time() - cpu_start
    if trainer.global_forward_batches != len(batches):
        raise SystemExit(f"the Trainer ran {trainer.global_forward_batches} of {len(batches)} steps")
    return elapsed


# ---------------------------------------------------------------------- running
def timed(fn: Callable[..., Timing], initial: torch.nn.Module, batches: list[dict],
          **kwargs: Any) -> tuple[Timing, torch.nn.Module]:
    """Train a fresh copy of ``initial`` (same weights every time) with a fresh SGD."""
    model = copy.deepcopy(initial)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    gc.collect()
    return fn(model, optimizer, batches, **kwargs), model


def same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.equal(pa, pb) for pa, pb in zip(a.parameters(), b.parameters(), strict=True))


SIDES: dict[str, dict[str, Any]] = {
    "hand": {"fn": hand_loop, "kwargs": {}},
    "trainer": {"fn": trainer_loop, "kwargs": {}},
    "trainer_raw_progress": {"fn": trainer_loop, "kwargs": {"progress_bar": "raw"}},
}


def summarise(us: dict[str, list[float]]) -> dict[str, Any]:
    """Medians per side, and the median of the per-round (paired) trainer/hand ratios and differences."""
    out: dict[str, Any] = {"median_us_per_step": {side: statistics.median(v) for side, v in us.items()},
                           "min_us_per_step": {side: min(v) for side, v in us.items()}}
    for side in us:
        if side == "hand":
            continue
        pairs = list(zip(us[side], us["hand"], strict=True))
        out[side] = {
            "ratio_of_medians": out["median_us_per_step"][side] / out["median_us_per_step"]["hand"],
            "overhead_us_per_step": out["median_us_per_step"][side] - out["median_us_per_step"]["hand"],
            "median_paired_ratio": statistics.median(t / h for t, h in pairs),
            "median_paired_overhead_us_per_step": statistics.median(t - h for t, h in pairs),
        }
    return out


def run_workload(name: str, steps: int, rounds: int, with_progress: bool) -> dict[str, Any]:
    spec = WORKLOADS[name]
    torch.manual_seed(SEED)
    initial = spec["model"]()
    batches = spec["batches"](steps)
    # Warm-up (not recorded): the first runs allocate and fill caches. It also checks that both
    # sides do the same computation: they must end with bit-identical weights.
    _, hand_model = timed(hand_loop, initial, batches[:50])
    _, trainer_model = timed(trainer_loop, initial, batches[:50])
    if not same_weights(hand_model, trainer_model):
        raise SystemExit(f"{name}: the hand loop and the Trainer ended with different weights; fix the benchmark.")
    sides = [s for s in SIDES if with_progress or s != "trainer_raw_progress"]
    wall: dict[str, list[float]] = {s: [] for s in sides}
    cpu: dict[str, list[float]] = {s: [] for s in sides}
    for r in range(rounds):
        # Interleaved rounds; the order flips every round so drift does not favour one side.
        for side in sides if r % 2 == 0 else reversed(sides):
            (w, c), _ = timed(SIDES[side]["fn"], initial, batches, **SIDES[side]["kwargs"])
            wall[side].append(w / steps * 1e6)
            cpu[side].append(c / steps * 1e6)
    return {
        "workload": name,
        "describe": spec["describe"],
        "steps": steps,
        "rounds": rounds,
        "wall": summarise(wall),
        "cpu": summarise(cpu),
        "wall_us_per_step_per_round": wall,
        "cpu_us_per_step_per_round": cpu,
    }


def print_table(results: list[dict[str, Any]]) -> None:
    header = (f"{'workload':<28} {'clock':<5} {'hand':>8} {'trainer':>8} {'ratio':>6} {'overhead':>8}"
              f" {'| +raw bar':>10} {'ratio':>6} {'overhead':>8}")
    print(header)
    print(f"{'':<28} {'':<5} {'µs/step':>8} {'µs/step':>8} {'':>6} {'µs/step':>8} {'| µs/step':>10}"
          f" {'':>6} {'µs/step':>8}")
    for res in results:
        for clock in ("cpu", "wall"):
            summary = res[clock]
            med = summary["median_us_per_step"]
            label = f"{res['workload']} {res['describe']}" if clock == "cpu" else ""
            line = (f"{label:<28} {clock:<5} {med['hand']:>8.1f} {med['trainer']:>8.1f}"
                    f" {summary['trainer']['ratio_of_medians']:>6.3f}"
                    f" {summary['trainer']['overhead_us_per_step']:>8.1f}")
            if "trainer_raw_progress" in med:
                raw = summary["trainer_raw_progress"]
                line += (f" {'| ' + format(med['trainer_raw_progress'], '.1f'):>10}"
                         f" {raw['ratio_of_medians']:>6.3f} {raw['overhead_us_per_step']:>8.1f}")
            print(line)
    print("medians over the rounds; cpu = process CPU time (robust to other load), wall = elapsed time.")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2000, help="batches per run (default 2000)")
    parser.add_argument("--rounds", type=int, default=9, help="timed rounds per side (default 9)")
    parser.add_argument("--workload", choices=["W1", "W2", "all"], default="all")
    parser.add_argument("--no-progress", action="store_true", help="skip the progress_bar='raw' runs")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH ('-' = stdout)")
    args = parser.parse_args(argv)
    if args.steps < 50 or args.rounds < 1:
        parser.error("--steps must be >= 50 and --rounds >= 1")
    torch.set_num_threads(1)
    names = list(WORKLOADS) if args.workload == "all" else [args.workload]
    print(f"torch {torch.__version__}, python {platform.python_version()}, {os.cpu_count()} CPUs, "
          f"1 torch thread, {args.steps} steps x {args.rounds} rounds (medians)")
    results = [run_workload(name, args.steps, args.rounds, not args.no_progress) for name in names]
    print_table(results)
    if args.json:
        payload = {
            "torch": torch.__version__,
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "machine": platform.machine(),
            "results": results,
        }
        text = json.dumps(payload, indent=2)
        if args.json == "-":
            print(text)
        else:
            with open(args.json, "w", encoding="utf-8") as fh:
                fh.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
