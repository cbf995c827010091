"""What does ``Trainer.run()`` with the distributed torch driver cost over a hand-written DDP loop?

Two processes, gloo on the CPU, one thread each. Both sides run in the same two
processes, on the same process group: the hand loop wraps the model in
``DistributedDataParallel`` itself and runs forward, backward, ``step()``,
``zero_grad(set_to_none=True)``; the Trainer gets the plain model (its driver wraps
it in DDP over the same group) and the same pre-built batches (each rank its own
list, ``use_dist_sampler=False``). Every round both sides start from the same
weights; the warm-up checks that they end with identical weights. Rounds alternate
(the order flips each round); each side reports the median over rounds of the
slower rank's wall time per step, and the median of the per-round ratios.

W1: MLP 32-64-10 (Linear-ReLU-Linear, cross-entropy), batch 32 per rank.

    python bench/ddp_overhead.py [--steps 1000] [--rounds 9] [--processes 2] [--json PATH]

It starts itself under torchrun (``torch.distributed.run``). With two processes sharing
two busy cores, the scheduler moves a step's wall time by ±10%; ``--processes 1`` (a
process group of one, DDP and gloo still in the path, no peer to wait for) shows the
loop's own cost more steadily. A measurement, not a test.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import torch  # noqa: E402 - after the thread settings
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

from drivetrain import Trainer  # noqa: E402

LR = 0.01


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(32, 64)
        self.fc2 = torch.nn.Linear(64, 10)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
        logits = self.fc2(torch.relu(self.fc1(x)))
        return {"loss": torch.nn.functional.cross_entropy(logits, target)}


def make_batches(steps: int, rank: int) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(1000 + rank)
    return [{"x": torch.randn(32, 32, generator=g), "target": torch.randint(0, 10, (32,), generator=g)}
            for _ in range(steps)]


def hand_loop(model: torch.nn.Module, batches: list[dict]) -> tuple[float, float]:
    """The reference: DDP by hand. Wrapping is not measured, like building the Trainer."""
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    dist.barrier()
    start, cpu = time.perf_counter(), time.process_time()
    for batch in batches:
        loss = ddp(batch["x"], batch["target"])["loss"]
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - start, time.process_time() - cpu


def trainer_loop(model: torch.nn.Module, batches: list[dict]) -> tuple[float, float]:
    trainer = Trainer(model, batches, torch.optim.SGD(model.parameters(), lr=LR), driver="torch", device="cpu",
                      n_epochs=1, progress_bar=None, use_dist_sampler=False)
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
    t = torch.tensor(seconds, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t[0]), float(t[1])


def measure(side: str, initial: torch.nn.Module, batches: list[dict]) -> tuple[dict[str, float], torch.nn.Module]:
    """µs per step, wall and CPU (of the whole process: gloo's threads included)."""
    model = copy.deepcopy(initial)
    gc.collect()
    wall, cpu = slowest(SIDES[side](model, batches))
    return {"wall": wall / len(batches) * 1e6, "cpu": cpu / len(batches) * 1e6}, model


def worker(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    initial = MLP()
    batches = make_batches(args.steps, rank)
    # warm-up, and the check that both sides compute the same thing
    _, hand_model = measure("hand", initial, batches[:50])
    _, trainer_model = measure("trainer", initial, batches[:50])
    same = all(torch.equal(a, b) for a, b in zip(hand_model.parameters(), trainer_model.parameters(), strict=True))
    if not same:
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
    dist.destroy_process_group()


def report(args: argparse.Namespace, rounds: dict[str, dict[str, list[float]]]) -> None:
    summary: dict = {
        "workload": f"W1: MLP 32-64-10, CE, bs=32 per rank, {dist.get_world_size()} process(es), gloo",
        "steps": args.steps, "rounds": args.rounds,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
                   f"torch {torch.__version__}",
    }
    print(f"DDP overhead, {summary['workload']}, {args.steps} steps x {args.rounds} rounds "
          "(µs/step of the slower rank; median / fastest round / median of paired ratios)")
    for metric, times in rounds.items():
        hand, trainer = statistics.median(times["hand"]), statistics.median(times["trainer"])
        paired = statistics.median(t / h for t, h in zip(times["trainer"], times["hand"], strict=True))
        fastest = min(times["trainer"]) / min(times["hand"])
        summary[metric] = {"hand": hand, "trainer": trainer, "ratio": trainer / hand, "paired_ratio": paired,
                           "fastest_ratio": fastest, "overhead_us": trainer - hand, "rounds_us": times}
        print(f"  {metric:4}: hand {hand:8.1f}  trainer {trainer:8.1f}  overhead {trainer - hand:+7.1f}  "
              f"ratio {trainer / hand:.3f}x / {fastest:.3f}x / {paired:.3f}x  (target <= 1.05x)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--json")
    args = parser.parse_args()
    if "RANK" in os.environ:
        worker(args)
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(args.processes), "--master_port", str(port),
           os.path.abspath(__file__), *sys.argv[1:]]
    sys.exit(subprocess.call(cmd))


if __name__ == "__main__":
    main()
