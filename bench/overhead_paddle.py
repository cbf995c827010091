"""What does ``Trainer.run()`` cost over a hand-written paddle loop? (paddle's counterpart of overhead.py)

Both sides train the same model from the same initial weights on the same
pre-generated batches (a list of ``{"x": tensor, "target": tensor}`` dicts of paddle
tensors), on the CPU, with SGD, in the Trainer's order: forward, backward, step,
``clear_grad(set_to_zero=False)``. The hand loop and the Trainer run in alternating
rounds (hand, trainer, trainer, hand, ...) so that background load hits both alike;
each side reports its median over the rounds, in CPU time of this process and in wall
time. Building the Trainer is not measured; ``run()`` is, whole.

Workloads (as in overhead.py):

- W1: MLP 32->64->10 (Linear-ReLU-Linear, cross-entropy), batch size 32.
- W2: Linear 8->2 (MSE), batch size 8: so little compute that the per-step
  overhead of the loop itself (µs/step, trainer - hand) is what shows.

    python bench/overhead_paddle.py [--steps N] [--rounds R] [--workload W1|W2|all] [--json PATH]

This is a measurement, not a test: nothing here asserts a timing.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import os
import platform
import statistics
import sys
import time
import warnings
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("GLOG_minloglevel", "2")

import numpy as np  # noqa: E402

with warnings.catch_warnings():  # paddle warns at import when ccache is not installed
    warnings.simplefilter("ignore")
    import paddle  # noqa: E402

from drivetrain import Trainer  # noqa: E402

SEED = 0
LR = 0.01


class MLP(paddle.nn.Layer):
    """W1: Linear-ReLU-Linear with cross-entropy."""

    def __init__(self, n_in: int = 32, hidden: int = 64, n_out: int = 10) -> None:
        super().__init__()
        self.fc1 = paddle.nn.Linear(n_in, hidden)
        self.fc2 = paddle.nn.Linear(hidden, n_out)

    def forward(self, x, target):
        logits = self.fc2(paddle.nn.functional.relu(self.fc1(x)))
        return {"loss": paddle.nn.functional.cross_entropy(logits, target)}


class Regression(paddle.nn.Layer):
    """W2: a single Linear layer with MSE."""

    def __init__(self, n_in: int = 8, n_out: int = 2) -> None:
        super().__init__()
        self.linear = paddle.nn.Linear(n_in, n_out)

    def forward(self, x, target):
        return {"loss": paddle.nn.functional.mse_loss(self.linear(x), target)}


def make_w1_batches(steps: int) -> list[dict[str, paddle.Tensor]]:
    rng = np.random.default_rng(SEED)
    return [{"x": paddle.to_tensor(rng.standard_normal((32, 32)).astype(np.float32)),
             "target": paddle.to_tensor(rng.integers(0, 10, 32))} for _ in range(steps)]


def make_w2_batches(steps: int) -> list[dict[str, paddle.Tensor]]:
    rng = np.random.default_rng(SEED)
    return [{"x": paddle.to_tensor(rng.standard_normal((8, 8)).astype(np.float32)),
             "target": paddle.to_tensor(rng.standard_normal((8, 2)).astype(np.float32))} for _ in range(steps)]


WORKLOADS: dict[str, dict[str, Any]] = {
    "W1": {"describe": "MLP 32-64-10, CE, bs=32", "model": MLP, "batches": make_w1_batches},
    "W2": {"describe": "Linear 8-2, MSE, bs=8", "model": Regression, "batches": make_w2_batches},
}


# ------------------------------------------------------------------ the two sides
def _timed(loop) -> dict[str, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    steps = loop()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"cpu": cpu / steps * 1e6, "wall": wall / steps * 1e6}


def hand_loop(model: paddle.nn.Layer, optimizer: Any, batches: list[dict]) -> dict[str, float]:
    """The reference: what a user would write by hand."""
    model.train()
    optimizer.clear_grad(set_to_zero=False)

    def loop() -> int:
        for batch in batches:
            loss = model(batch["x"], batch["target"])["loss"]
            loss.backward()
            optimizer.step()
            optimizer.clear_grad(set_to_zero=False)
        return len(batches)

    return _timed(loop)


def trainer_loop(model: paddle.nn.Layer, optimizer: Any, batches: list[dict]) -> dict[str, float]:
    """The same training through ``Trainer.run()``; building the Trainer is not measured."""
    trainer = Trainer(model, batches, optimizer, driver="paddle", device="cpu", n_epochs=1, progress_bar=None)

    def loop() -> int:
        with contextlib.redirect_stdout(io.StringIO()):
            trainer.run(num_eval_sanity_batch=0)
        return trainer.global_forward_batches

    result = _timed(loop)
    if trainer.global_forward_batches != len(batches):
        raise SystemExit(f"the Trainer ran {trainer.global_forward_batches} of {len(batches)} steps")
    return result


SIDES = {"hand": hand_loop, "trainer": trainer_loop}


# ---------------------------------------------------------------------- running
def measure(side: str, spec: dict[str, Any], weights: dict[str, np.ndarray],
            batches: list[dict]) -> tuple[dict[str, float], paddle.nn.Layer]:
    """Train a fresh model with the same initial weights and a fresh SGD."""
    model = spec["model"]()
    model.set_state_dict({k: paddle.to_tensor(v) for k, v in weights.items()})
    optimizer = paddle.optimizer.SGD(learning_rate=LR, parameters=model.parameters())
    gc.collect()
    return SIDES[side](model, optimizer, batches), model


def same_weights(a: paddle.nn.Layer, b: paddle.nn.Layer) -> bool:
    return all(np.array_equal(pa.numpy(), pb.numpy()) for pa, pb in zip(a.parameters(), b.parameters(), strict=True))


def run_workload(name: str, steps: int, rounds: int) -> dict[str, Any]:
    spec = WORKLOADS[name]
    paddle.seed(SEED)
    weights = {k: v.numpy() for k, v in spec["model"]().state_dict().items()}
    batches = spec["batches"](steps)
    # Warm-up (not recorded); it also checks that both sides do the same computation.
    _, hand_model = measure("hand", spec, weights, batches[:50])
    _, trainer_model = measure("trainer", spec, weights, batches[:50])
    if not same_weights(hand_model, trainer_model):
        raise SystemExit(f"{name}: the hand loop and the Trainer ended with different weights; fix the benchmark.")
    per_round: dict[str, dict[str, list[float]]] = {m: {s: [] for s in SIDES} for m in ("cpu", "wall")}
    for r in range(rounds):
        for side in SIDES if r % 2 == 0 else reversed(SIDES):
            result, _ = measure(side, spec, weights, batches)
            for metric, value in result.items():
                per_round[metric][side].append(value)
    summary = {}
    for metric, values in per_round.items():
        median = {side: statistics.median(v) for side, v in values.items()}
        pairs = list(zip(values["trainer"], values["hand"], strict=True))  # same round: same background load
        summary[metric] = {"median": median, "ratio": median["trainer"] / median["hand"],
                           "overhead": median["trainer"] - median["hand"],
                           "median_paired_ratio": statistics.median(t / h for t, h in pairs)}
    return {"workload": name, "describe": spec["describe"], "steps": steps, "rounds": rounds,
            "unit": "µs/step", **summary, "per_round": per_round}


def print_table(results: list[dict[str, Any]]) -> None:
    print(f"{'':<28} {'':<12}  {'hand':>8}  {'trainer':>8} {'ratio':>6} {'overhead':>8} {'paired':>7}")
    for res in results:
        for n, metric in enumerate(("cpu", "wall")):
            summary = res[metric]
            label = f"{res['workload']} {res['describe']}" if n == 0 else ""
            print(f"{label:<28} {metric + ' µs/step':<12}  {summary['median']['hand']:>8.1f}  "
                  f"{summary['median']['trainer']:>8.1f} {summary['ratio']:>6.3f} {summary['overhead']:>8.1f} "
                  f"{summary['median_paired_ratio']:>7.3f}")
    print(f"medians over {results[0]['rounds']} interleaved round(s); overhead = trainer - hand; paired = median "
          "of the per-round trainer/hand ratios. cpu = CPU time of this process, wall = elapsed.")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2000, help="batches per run (default 2000)")
    parser.add_argument("--rounds", type=int, default=9, help="measured rounds per side (default 9)")
    parser.add_argument("--workload", choices=["W1", "W2", "all"], default="all")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH ('-' = stdout)")
    args = parser.parse_args(argv)
    if args.steps < 50 or args.rounds < 1:
        parser.error("--steps must be >= 50 and --rounds >= 1")
    paddle.set_device("cpu")
    names = list(WORKLOADS) if args.workload == "all" else [args.workload]
    print(f"paddle {paddle.__version__}, python {platform.python_version()}, {os.cpu_count()} CPUs, "
          f"OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}, {args.steps} steps x {args.rounds} rounds")
    results = [run_workload(name, args.steps, args.rounds) for name in names]
    print_table(results)
    if args.json:
        text = json.dumps({"paddle": paddle.__version__, "python": platform.python_version(),
                           "cpus": os.cpu_count(), "machine": platform.machine(), "results": results}, indent=2)
        if args.json == "-":
            print(text)
        else:
            with open(args.json, "w", encoding="utf-8") as fh:
                fh.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
