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
import subprocess
import sys
import time
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


# ----------------------------------------------------------------------- meters
class TimeMeter:
    """Wall time and CPU time of this process (CPU time does not count time lost to other processes)."""

    metrics = ("cpu", "wall")
    unit = "µs/step"

    def start(self) -> None:
        self._wall, self._cpu = time.perf_counter(), time.process_time()

    def stop(self, steps: int) -> dict[str, float]:
        wall, cpu = time.perf_counter() - self._wall, time.process_time() - self._cpu
        return {"cpu": cpu / steps * 1e6, "wall": wall / steps * 1e6}


class CallgrindMeter:
    """Instructions executed, counted by valgrind's callgrind: deterministic, immune to machine load.

    The process must run under ``valgrind --tool=callgrind --instr-atstart=no
    --callgrind-out-file=OUT``; counting is switched on around each measured loop with
    ``callgrind_control`` and each loop's total is read back from the dump it writes
    (``OUT.1``, ``OUT.2``, ...).
    """

    metrics = ("instructions",)
    unit = "instr/step"

    def __init__(self, out_file: str) -> None:
        self.out_file = out_file
        self.dumps = 0

    def _control(self, *args: str) -> None:
        done = subprocess.run(["callgrind_control", *args, str(os.getpid())], capture_output=True, text=True)
        if done.returncode != 0 or "Error" in done.stdout + done.stderr:
            raise SystemExit(f"callgrind_control {' '.join(args)} failed: is this process running under "
                             f"valgrind --tool=callgrind --instr-atstart=no?\n{done.stdout}{done.stderr}")

    def start(self) -> None:
        self._control("--zero")
        self._control("--instr=on")

    def stop(self, steps: int) -> dict[str, float]:
        self._control("--instr=off")
        self._control("--dump")
        self.dumps += 1
        with open(f"{self.out_file}.{self.dumps}", encoding="utf-8") as fh:
            totals = [line for line in fh if line.startswith("totals:")]
        return {"instructions": int(totals[-1].split()[1]) / steps}


Meter = TimeMeter | CallgrindMeter


# ------------------------------------------------------------------ the two sides
def hand_loop(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batches: list[dict],
              meter: Meter) -> dict[str, float]:
    """The reference: what a user would write by hand."""
    model.train()
    optimizer.zero_grad(set_to_none=True)
    meter.start()
    for batch in batches:
        loss = model(batch["x"], batch["target"])["loss"]
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return meter.stop(len(batches))


def trainer_loop(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batches: list[dict],
                 meter: Meter, progress_bar: Any = None) -> dict[str, float]:
    """The same training through ``Trainer.run()``; building the Trainer is not measured."""
    trainer = Trainer(model, batches, optimizer, driver="torch", device="cpu", n_epochs=1,
                      progress_bar=progress_bar)
    with contextlib.redirect_stdout(io.StringIO()):
        meter.start()
        trainer.run()
        result = meter.stop(len(batches))
    if trainer.global_forward_batches != len(batches):
        raise SystemExit(f"the Trainer ran {trainer.global_forward_batches} of {len(batches)} steps")
    return result


SIDES: dict[str, dict[str, Any]] = {
    "hand": {"fn": hand_loop, "kwargs": {}},
    "trainer": {"fn": trainer_loop, "kwargs": {}},
    "trainer_raw_progress": {"fn": trainer_loop, "kwargs": {"progress_bar": "raw"}},
}


# ---------------------------------------------------------------------- running
def measure(side: str, initial: torch.nn.Module, batches: list[dict],
            meter: Meter) -> tuple[dict[str, float], torch.nn.Module]:
    """Train a fresh copy of ``initial`` (same weights every time) with a fresh SGD."""
    model = copy.deepcopy(initial)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    gc.collect()
    return SIDES[side]["fn"](model, optimizer, batches, meter, **SIDES[side]["kwargs"]), model


def same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.equal(pa, pb) for pa, pb in zip(a.parameters(), b.parameters(), strict=True))


def summarise(per_round: dict[str, list[float]]) -> dict[str, Any]:
    """Medians per side, and the median of the per-round (paired) trainer/hand ratios and differences."""
    median = {side: statistics.median(v) for side, v in per_round.items()}
    out: dict[str, Any] = {"median": median, "min": {side: min(v) for side, v in per_round.items()}}
    for side, values in per_round.items():
        if side == "hand":
            continue
        pairs = list(zip(values, per_round["hand"], strict=True))
        out[side] = {
            "ratio": median[side] / median["hand"],
            "overhead": median[side] - median["hand"],
            "median_paired_ratio": statistics.median(t / h for t, h in pairs),
            "median_paired_overhead": statistics.median(t - h for t, h in pairs),
        }
    return out


def run_workload(name: str, steps: int, rounds: int, with_progress: bool, meter: Meter) -> dict[str, Any]:
    spec = WORKLOADS[name]
    torch.manual_seed(SEED)
    initial = spec["model"]()
    batches = spec["batches"](steps)
    # Warm-up (not recorded): the first runs allocate and fill caches. It also checks that both
    # sides do the same computation: they must end with bit-identical weights.
    warm_meter = TimeMeter()
    _, hand_model = measure("hand", initial, batches[:50], warm_meter)
    _, trainer_model = measure("trainer", initial, batches[:50], warm_meter)
    if not same_weights(hand_model, trainer_model):
        raise SystemExit(f"{name}: the hand loop and the Trainer ended with different weights; fix the benchmark.")
    sides = [s for s in SIDES if with_progress or s != "trainer_raw_progress"]
    per_round: dict[str, dict[str, list[float]]] = {m: {s: [] for s in sides} for m in meter.metrics}
    for r in range(rounds):
        # Interleaved rounds; the order flips every round so drift does not favour one side.
        for side in sides if r % 2 == 0 else reversed(sides):
            result, _ = measure(side, initial, batches, meter)
            for metric, value in result.items():
                per_round[metric][side].append(value)
    return {
        "workload": name,
        "describe": spec["describe"],
        "steps": steps,
        "rounds": rounds,
        "unit": meter.unit,
        **{metric: summarise(values) for metric, values in per_round.items()},
        "per_round": per_round,
    }


def print_table(results: list[dict[str, Any]], meter: Meter) -> None:
    unit = meter.unit
    digits = 0 if unit == "instr/step" else 1
    width = 11 if unit == "instr/step" else 8
    sides = ("hand", "trainer", "trainer_raw_progress")
    print(f"{'':<28} {'':<12}  {'hand':>{width}}  {'trainer':>{width}} {'ratio':>6} {'overhead':>{width}}"
          f"  {'raw bar':>{width}} {'ratio':>6} {'overhead':>{width}}")
    for res in results:
        for n, metric in enumerate(meter.metrics):
            summary = res[metric]
            label = f"{res['workload']} {res['describe']}" if n == 0 else ""
            cells = [f"{label:<28} {(metric + ' ' + unit) if metric != 'instructions' else unit:<12}"]
            for side in sides:
                if side not in summary["median"]:
                    continue
                cells.append(f"{summary['median'][side]:>{width}.{digits}f}")
                if side != "hand":
                    cells[-1] += f" {summary[side]['ratio']:>6.3f} {summary[side]['overhead']:>{width}.{digits}f}"
            print("  ".join(cells))
    print(f"medians over {results[0]['rounds']} interleaved round(s); overhead = trainer - hand."
          + (" cpu = CPU time of this process, wall = elapsed." if unit == "µs/step" else ""))
    if unit == "µs/step" and results[0]["rounds"] > 1:
        # On a loaded machine the medians of the two sides can drift apart; the fastest round of
        # each side and the median of the per-round (paired) ratios are steadier views of the same runs.
        for res in results:
            cpu = res["cpu"]
            print(f"  {res['workload']} cpu, fastest rounds: ratio {cpu['min']['trainer'] / cpu['min']['hand']:.3f}, "
                  f"overhead {cpu['min']['trainer'] - cpu['min']['hand']:.1f} µs/step; paired rounds: median ratio "
                  f"{cpu['trainer']['median_paired_ratio']:.3f}, overhead "
                  f"{cpu['trainer']['median_paired_overhead']:.1f} µs/step")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2000, help="batches per run (default 2000)")
    parser.add_argument("--rounds", type=int, default=9, help="measured rounds per side (default 9)")
    parser.add_argument("--workload", choices=["W1", "W2", "all"], default="all")
    parser.add_argument("--no-progress", action="store_true", help="skip the progress_bar='raw' runs")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH ('-' = stdout)")
    parser.add_argument("--callgrind", metavar="OUT", help="count instructions instead of timing; run as "
                        "valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file=OUT python "
                        "bench/overhead.py --callgrind OUT --rounds 1 ...")
    args = parser.parse_args(argv)
    if args.steps < 50 or args.rounds < 1:
        parser.error("--steps must be >= 50 and --rounds >= 1")
    torch.set_num_threads(1)
    meter: Meter = CallgrindMeter(args.callgrind) if args.callgrind else TimeMeter()
    names = list(WORKLOADS) if args.workload == "all" else [args.workload]
    print(f"torch {torch.__version__}, python {platform.python_version()}, {os.cpu_count()} CPUs, "
          f"1 torch thread, {args.steps} steps x {args.rounds} rounds")
    results = [run_workload(name, args.steps, args.rounds, not args.no_progress, meter) for name in names]
    print_table(results, meter)
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
