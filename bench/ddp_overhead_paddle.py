"""What does ``Trainer.run()`` with the distributed paddle driver cost over a hand-written data-parallel loop?

Two processes, gloo on the CPU, one thread each. Both sides run in the same two
processes, in the same parallel environment: the hand loop is paddle's documented one
(``paddle.DataParallel``, forward through it, ``backward`` all-reduces the gradients in
its reducer, ``step()``, ``clear_grad()``); the Trainer gets the plain model (its driver
wraps it in ``paddle.DataParallel`` too, and all-reduces the gradients once per step,
before ``step()``) and the same pre-built batches (each rank its own list,
``use_dist_sampler=False``). Every round both sides start from the same weights; the
warm-up checks that they end with the same weights (to float rounding: the two
all-reduce the gradients in different groupings). Rounds alternate (the order flips
each round); each side reports the median over rounds of the slower rank's wall time
per step, and the median of the per-round ratios.

W1: MLP 32-64-10 (Linear-ReLU-Linear, cross-entropy), batch 32 per rank.

    python bench/ddp_overhead_paddle.py [--steps 1000] [--rounds 9] [--json PATH]

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
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = paddle.nn.Linear(32, 64)
        self.fc2 = paddle.nn.Linear(64, 10)

    def forward(self, x, target) -> dict:
        logits = self.fc2(paddle.nn.functional.relu(self.fc1(x)))
        return {"loss": paddle.nn.functional.cross_entropy(logits, target)}


def make_batches(steps: int, rank: int) -> list[dict]:
    rng = np.random.default_rng(1000 + rank)
    return [{"x": paddle.to_tensor(rng.standard_normal((32, 32)).astype(np.float32)),
             "target": paddle.to_tensor(rng.integers(0, 10, (32,)))} for _ in range(steps)]


def hand_loop(model: paddle.nn.Layer, batches: list[dict]) -> tuple[float, float]:
    """The reference: paddle.DataParallel by hand. Wrapping is not measured, like building the Trainer."""
    dp = paddle.DataParallel(model)
    optimizer = paddle.optimizer.SGD(learning_rate=LR, parameters=model.parameters())
    dist.barrier()
    start, cpu = time.perf_counter(), time.process_time()
    for batch in batches:
        loss = dp(batch["x"], batch["target"])["loss"]
        loss.backward()
        optimizer.step()
        optimizer.clear_grad()
    return time.perf_counter() - start, time.process_time() - cpu


def trainer_loop(model: paddle.nn.Layer, batches: list[dict]) -> tuple[float, float]:
    trainer = Trainer(model, batches, paddle.optimizer.SGD(learning_rate=LR, parameters=model.parameters()),
                      driver="paddle", device="cpu", n_epochs=1, progress_bar=None, use_dist_sampler=False)
    dist.barrier()
    start, cpu = time.perf_counter(), time.process_time()
    trainer.run()
    took = time.perf_counter() - start, time.process_time() - cpu
    if trainer.global_forward_batches != len(batches):
        raise SystemExit(f"the Trainer ran {trainer.global_forward_batches} of {len(batches)} steps")
    return took


SIDES = {"hand": hand_loop, "trainer": trainer_loop}


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
    rank = dist.get_rank()
    paddle.seed(0)
    initial = MLP()
    batches = make_batches(args.steps, rank)
    # warm-up, and the check that both sides compute the same thing
    _, hand_model = measure("hand", initial, batches[:50])
    _, trainer_model = measure("trainer", initial, batches[:50])
    for a, b in zip(hand_model.parameters(), trainer_model.parameters(), strict=True):
        if not np.allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6):
            raise SystemExit("the hand loop and the Trainer ended with different weights")
    rounds: dict[str, dict[str, list[float]]] = {m: {"hand": [], "trainer": []} for m in ("wall", "cpu")}
    for r in range(args.rounds):
        order = ("hand", "trainer") if r % 2 == 0 else ("trainer", "hand")
        for side in order:
            result = measure(side, initial, batches)[0]
            for metric, us in result.items():
                rounds[metric][side].append(us)
    if rank == 0:
        report(args, rounds)


def report(args: argparse.Namespace, rounds: dict[str, dict[str, list[float]]]) -> None:
    summary: dict = {
        "workload": f"W1: MLP 32-64-10, CE, bs=32 per rank, {dist.get_world_size()} processes, gloo",
        "steps": args.steps, "rounds": args.rounds,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
                   f"paddle {paddle.__version__}",
    }
    print(f"paddle data-parallel overhead, {summary['workload']}, {args.steps} steps x {args.rounds} rounds "
          "(µs/step of the slower rank; median / fastest round / median of paired ratios)", flush=True)
    for metric, times in rounds.items():
        hand, trainer = statistics.median(times["hand"]), statistics.median(times["trainer"])
        paired = statistics.median(t / h for t, h in zip(times["trainer"], times["hand"], strict=True))
        fastest = min(times["trainer"]) / min(times["hand"])
        summary[metric] = {"hand": hand, "trainer": trainer, "ratio": trainer / hand, "paired_ratio": paired,
                           "fastest_ratio": fastest, "overhead_us": trainer - hand, "rounds_us": times}
        print(f"  {metric:4}: hand {hand:8.1f}  trainer {trainer:8.1f}  overhead {trainer - hand:+7.1f}  "
              f"ratio {trainer / hand:.3f}x / {fastest:.3f}x / {paired:.3f}x  (target <= 1.05x)", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1000)
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
