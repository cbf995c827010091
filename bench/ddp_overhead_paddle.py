"""What does ``Trainer.run()`` with the distributed paddle driver cost over a hand-written data-parallel loop,
and does all-reducing the gradients during backward (overlap) pay on this machine?

Two processes, gloo on the CPU, one thread each. Every side runs in the same two
processes, in the same parallel environment, on the same pre-built batches (each rank
its own list; the Trainer with ``use_dist_sampler=False``), from the same weights:

- ``hand``: paddle's documented loop (``paddle.DataParallel``, forward through it,
  ``backward`` all-reduces the gradients in DataParallel's reducer while it runs,
  ``step()``, ``clear_grad()``);
- ``hand-after``: the same loop with the reducer off (``grad_need_sync = False``) and the
  gradients all-reduced after backward, in flat buckets, by hand;
- ``trainer``: the Trainer with ``paddle_kwargs={"overlap": True}`` (the reducer);
- ``trainer-after``: the Trainer with ``overlap=False`` (one all-reduce per step, after backward).

The warm-up checks that all sides end with the same weights (to float rounding: the
all-reduces group the gradients differently). Rounds alternate (the order rotates each
round); each side reports the median over rounds of the slower rank's wall time per
step, and the median of the per-round ratios against ``hand``.

W1: MLP 32-64-10 (Linear-ReLU-Linear, cross-entropy), batch 32 per rank.
W3: MLP 1024-2048-2048-1024 (8.4M parameters, MSE), batch 64 per rank: a long backward.

    python bench/ddp_overhead_paddle.py [--workload W1|W3|all] [--steps N] [--rounds 9] [--json PATH]

It starts itself under paddle's launcher (``python -m paddle.distributed.launch``,
logs in a temporary folder); rank 0 prints the table. With two processes sharing two
busy cores, the scheduler moves a step's wall time by ±10%. A measurement, not a test.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("GLOG_minloglevel", "2")

import numpy as np  # noqa: E402

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # "No ccache found"
    import paddle  # noqa: E402
import paddle.distributed as dist  # noqa: E402

from drivetrain import Trainer  # noqa: E402

LR = 0.01


class MLP(paddle.nn.Layer):
    """Linear layers with ReLU between; cross-entropy on class targets, MSE on float ones."""

    def __init__(self, sizes: tuple[int, ...]) -> None:
        super().__init__()
        self.layers = paddle.nn.LayerList([paddle.nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:], strict=True)])

    def forward(self, x, target) -> dict:
        for i, layer in enumerate(self.layers):
            x = layer(x) if i == 0 else layer(paddle.nn.functional.relu(x))
        if target.dtype == paddle.int64:
            return {"loss": paddle.nn.functional.cross_entropy(x, target)}
        return {"loss": paddle.nn.functional.mse_loss(x, target)}


WORKLOADS = {  # name: (layer sizes, batch per rank, classes (0: regression), default steps)
    "W1": ((32, 64, 10), 32, 10, 1000),
    "W3": ((1024, 2048, 2048, 1024), 64, 0, 40),
}


def make_batches(workload: str, steps: int, rank: int) -> list[dict]:
    sizes, batch, classes, _ = WORKLOADS[workload]
    rng = np.random.default_rng(1000 + rank)

    def target() -> np.ndarray:
        if classes:
            return rng.integers(0, classes, (batch,))
        return rng.standard_normal((batch, sizes[-1])).astype(np.float32)

    return [{"x": paddle.to_tensor(rng.standard_normal((batch, sizes[0])).astype(np.float32)),
             "target": paddle.to_tensor(target())} for _ in range(steps)]


def hand_loop(model: paddle.nn.Layer, batches: list[dict], after: bool = False) -> tuple[float, float]:
    """The reference: paddle.DataParallel by hand. Wrapping is not measured, like building the Trainer.
    ``after``: the reducer off, the gradients all-reduced after backward in one flat bucket per dtype."""
    dp = paddle.DataParallel(model)
    dp.grad_need_sync = not after
    params = [p for p in model.parameters() if not p.stop_gradient]
    optimizer = paddle.optimizer.SGD(learning_rate=LR, parameters=model.parameters())
    scale = 1.0 / dist.get_world_size()
    dist.barrier()
    start, cpu = time.perf_counter(), time.process_time()
    for batch in batches:
        loss = dp(batch["x"], batch["target"])["loss"]
        loss.backward()
        if after:
            with paddle.no_grad():
                flat = paddle.concat([p.grad.reshape([-1]) for p in params])
                dist.all_reduce(flat)
                flat.scale_(scale)
                for p, piece in zip(params, paddle.split(flat, [p.size for p in params]), strict=True):
                    paddle.assign(piece.reshape(p.shape), output=p.grad)
        optimizer.step()
        optimizer.clear_grad()
    return time.perf_counter() - start, time.process_time() - cpu


def trainer_loop(model: paddle.nn.Layer, batches: list[dict], overlap: bool = True) -> tuple[float, float]:
    trainer = Trainer(model, batches, paddle.optimizer.SGD(learning_rate=LR, parameters=model.parameters()),
                      driver="paddle", device="cpu", n_epochs=1, progress_bar=None, use_dist_sampler=False,
                      paddle_kwargs={"overlap": overlap})
    dist.barrier()
    start, cpu = time.perf_counter(), time.process_time()
    trainer.run()
    took = time.perf_counter() - start, time.process_time() - cpu
    if trainer.global_forward_batches != len(batches):
        raise SystemExit(f"the Trainer ran {trainer.global_forward_batches} of {len(batches)} steps")
    return took


SIDES = {"hand": hand_loop, "hand-after": lambda m, b: hand_loop(m, b, after=True),
         "trainer": trainer_loop, "trainer-after": lambda m, b: trainer_loop(m, b, overlap=False)}


def slowest(seconds: tuple[float, float]) -> tuple[float, float]:
    """The slowest rank's (wall, CPU) time: a step is as slow as its slowest process."""
    t = paddle.to_tensor(np.array(seconds, dtype=np.float64))
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    wall, cpu = t.numpy().tolist()
    return wall, cpu


def measure(side: str, initial: paddle.nn.Layer, batches: list[dict]) -> tuple[dict[str, float], paddle.nn.Layer]:
    """µs per step, wall and CPU (of the whole process: gloo's threads included)."""
    model = copy.deepcopy(initial)
    gc.collect()
    wall, cpu = slowest(SIDES[side](model, batches))
    return {"wall": wall / len(batches) * 1e6, "cpu": cpu / len(batches) * 1e6}, model


def worker(args: argparse.Namespace) -> None:
    dist.init_parallel_env()
    for workload in WORKLOADS if args.workload == "all" else [args.workload]:
        run_workload(args, workload)


def run_workload(args: argparse.Namespace, workload: str) -> None:
    rank = dist.get_rank()
    paddle.seed(0)
    initial = MLP(WORKLOADS[workload][0])
    steps = args.steps or WORKLOADS[workload][3]
    batches = make_batches(workload, steps, rank)
    # warm-up, and the check that every side computes the same thing
    warm = batches[: min(50, steps)]
    ends = {side: measure(side, initial, warm)[1] for side in SIDES}
    for side, model in ends.items():
        for a, b in zip(ends["hand"].parameters(), model.parameters(), strict=True):
            if not np.allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-6):
                raise SystemExit(f"{workload}: the hand loop and {side} ended with different weights")
    rounds: dict[str, dict[str, list[float]]] = {m: {side: [] for side in SIDES} for m in ("wall", "cpu")}
    names = list(SIDES)
    for r in range(args.rounds):
        for side in names[r % len(names):] + names[:r % len(names)]:  # each side leads in turn
            result = measure(side, initial, batches)[0]
            for metric, us in result.items():
                rounds[metric][side].append(us)
    if rank == 0:
        report(args, workload, steps, rounds)


def report(args: argparse.Namespace, workload: str, steps: int, rounds: dict[str, dict[str, list[float]]]) -> None:
    sizes, batch, classes, _ = WORKLOADS[workload]
    params = sum(a * b + b for a, b in zip(sizes[:-1], sizes[1:], strict=True))
    summary: dict = {
        "workload": f"{workload}: MLP {'-'.join(map(str, sizes))} ({params:,} parameters), "
                    f"{'CE' if classes else 'MSE'}, bs={batch} per rank, {dist.get_world_size()} processes, gloo",
        "steps": steps, "rounds": args.rounds, "load": os.getloadavg(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
                   f"paddle {paddle.__version__}",
    }
    print(f"paddle data-parallel, {summary['workload']}, {steps} steps x {args.rounds} rounds, load "
          f"{summary['load'][0]:.2f} (µs/step of the slower rank; median / ratio of medians to hand / median of "
          "paired ratios)", flush=True)
    for metric, times in rounds.items():
        hand = statistics.median(times["hand"])
        summary[metric] = {}
        for side, values in times.items():
            median = statistics.median(values)
            paired = statistics.median(t / h for t, h in zip(values, times["hand"], strict=True))
            summary[metric][side] = {"median_us": median, "ratio": median / hand, "paired_ratio": paired,
                                     "rounds_us": values}
            print(f"  {metric:4} {side:13}: {median:10.1f}  {median / hand:.3f}x  {paired:.3f}x", flush=True)
    if args.json:
        path = args.json.replace(".json", f"-{workload}.json") if args.workload == "all" else args.json
        with open(path, "w") as f:
            json.dump(summary, f, indent=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=(*WORKLOADS, "all"), default="all")
    parser.add_argument("--steps", type=int, help="steps per round (default: 1000 for W1, 40 for W3)")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--json")
    args = parser.parse_args()
    if "PADDLE_TRAINER_ID" in os.environ:
        worker(args)
        return
    with tempfile.TemporaryDirectory(prefix="paddle-launch-") as logs:  # never ./log: it holds the environment
        cmd = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", "2", "--log_dir", logs,
               os.path.abspath(__file__), *sys.argv[1:]]
        sys.exit(subprocess.call(cmd))


if __name__ == "__main__":
    main()
