"""Does a DataLoader with workers keep its throughput under the Trainer's reproducible sampling?

The Trainer rebuilds a framework DataLoader that samples the default way around its
resumable batch sampler (copying every other setting) and leaves a loader with a
sampler of the user's alone. This measures what that costs on a loader-bound workload:
samples/s of a hand-written loop iterating the user's DataLoader with a tiny train step,
against ``Trainer.run()`` on the same loader, per loader configuration.

Workload: a map-style dataset whose ``__getitem__`` decodes and augments a synthetic
3x32x32 uint8 image in numpy (draw the pixels, random 24x24 crop, random flip, a 3x3
box blur, per-channel normalisation: a few hundred µs per sample), a linear classifier
1728 -> 10 (cross-entropy, SGD), batch 32, ``--epochs`` epochs. The loader dominates.

Both sides get a fresh DataLoader from the same factory each run (building it is not
measured; starting its workers, inside the first ``iter()``, is measured on both sides),
and the fresh loader is dropped (its workers stopped) before the next run. Sides run in
alternating rounds (the order flips every round); each side reports the median over the
rounds, and the median of the per-round (paired) ratios. Two meters: samples/s in wall
time (what a user waits for; noisy on a shared machine), and CPU µs per sample of this
process plus its worker processes (counted once the workers are stopped and joined), which
shows extra work (a second set of workers, wasted prefetching, a per-batch copy) whatever
else the machine runs. Run in the framework's own environment:

    OMP_NUM_THREADS=1 python bench/loader.py --framework torch [--samples 2048 --epochs 2 --rounds 7]
    OMP_NUM_THREADS=1 GLOG_minloglevel=2 python bench/loader.py --framework paddle
    OMP_NUM_THREADS=1 python bench/loader.py --framework oneflow
    python bench/loader.py --framework torch --device cuda      # pin_memory=True, a CUDA model

This is a measurement, not a test: nothing here asserts a timing.
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import numpy as np  # noqa: E402

BATCH = 32
CLASSES = 10
CROP = 24
FEATURES = 3 * CROP * CROP
LR = 0.01


class SyntheticImages:
    """Map-style dataset: each sample is a synthetic image decoded and augmented in numpy (loader-bound)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        rng = np.random.default_rng(i)
        image = rng.integers(0, 256, (3, 32, 32), dtype=np.uint8)  # stands in for decoding a file
        top, left = rng.integers(0, 32 - CROP + 1, 2)
        x = image[:, top:top + CROP, left:left + CROP].astype(np.float32) / 255.0
        if rng.random() < 0.5:
            x = x[:, :, ::-1]
        padded = np.pad(x, ((0, 0), (1, 1), (1, 1)), mode="edge")
        x = sum(padded[:, r:r + CROP, c:c + CROP] for r in range(3) for c in range(3)) / 9.0
        x = (x - x.mean(axis=(1, 2), keepdims=True)) / (x.std(axis=(1, 2), keepdims=True) + 1e-6)
        return {"x": np.ascontiguousarray(x.reshape(-1), dtype=np.float32), "target": np.int64(i % CLASSES)}


class OwnSampler:
    """A sampler of the user's own (a plain iterable of indices, reshuffled every epoch): the Trainer leaves it alone."""

    def __init__(self, n: int, seed: int = 0) -> None:
        self.n, self.rng = n, np.random.default_rng(seed)

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Any:
        return iter(self.rng.permutation(self.n).tolist())


def sample_cost_us(dataset: SyntheticImages, n: int = 300) -> float:
    start = time.perf_counter()
    for i in range(n):
        dataset[i]
    return (time.perf_counter() - start) / n * 1e6


# ------------------------------------------------------------------ frameworks
@dataclass
class Framework:
    """One framework: its model, loaders and hand-written step."""

    name: str
    version: str
    make_model: Callable[[], Any]
    make_optimizer: Callable[[Any], Any]
    hand_step: Callable[[Any, Any, dict[str, Any]], None]
    configs: dict[str, Callable[[SyntheticImages], Any]]
    """Loader factories by configuration name; each call builds a fresh loader."""
    close: Callable[[Any], None] = lambda loader: None
    """Stop a loader's persistent workers (before the next run starts its own)."""
    device: str = "cpu"


def torch_framework(device: str) -> Framework:
    import torch
    from torch.utils.data import DataLoader, WeightedRandomSampler

    torch.set_num_threads(1)
    pin = device != "cpu"  # pinning without an accelerator only earns a warning from torch

    class Linear(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(FEATURES, CLASSES)

        def forward(self, x: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
            return {"loss": torch.nn.functional.cross_entropy(self.fc(x), target)}

    def make_model() -> torch.nn.Module:
        torch.manual_seed(0)
        return Linear().to(device)

    def hand_step(model: Any, optimizer: Any, batch: dict[str, Any]) -> None:
        x = batch["x"].to(device, non_blocking=pin)
        target = batch["target"].to(device, non_blocking=pin)
        model(x, target)["loss"].backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def weighted(dataset: SyntheticImages) -> DataLoader:
        weights = torch.linspace(0.5, 1.0, len(dataset))
        sampler = WeightedRandomSampler(weights, len(dataset), replacement=True)
        return DataLoader(dataset, BATCH, sampler=sampler, num_workers=2, pin_memory=pin, persistent_workers=True,
                          prefetch_factor=4)

    def close(loader: Any) -> None:
        iterator = getattr(loader, "_iterator", None)
        if iterator is not None and hasattr(iterator, "_shutdown_workers"):
            iterator._shutdown_workers()

    return Framework(
        "torch", torch.__version__, make_model, lambda m: torch.optim.SGD(m.parameters(), lr=LR), hand_step,
        {
            "num_workers=0": lambda d: DataLoader(d, BATCH, shuffle=True),
            f"num_workers=2, pin_memory={pin}, persistent, prefetch_factor=4": lambda d: DataLoader(
                d, BATCH, shuffle=True, num_workers=2, pin_memory=pin, persistent_workers=True, prefetch_factor=4),
            "num_workers=2 (not persistent)": lambda d: DataLoader(d, BATCH, shuffle=True, num_workers=2),
            "WeightedRandomSampler, num_workers=2, persistent (left alone)": weighted,
        },
        close, device,
    )


def paddle_framework(device: str) -> Framework:
    import paddle
    from paddle.io import BatchSampler, DataLoader, WeightedRandomSampler

    paddle.set_device(device)

    class Linear(paddle.nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.fc = paddle.nn.Linear(FEATURES, CLASSES)

        def forward(self, x: Any, target: Any) -> dict[str, Any]:
            return {"loss": paddle.nn.functional.cross_entropy(self.fc(x), target)}

    def make_model() -> Any:
        paddle.seed(0)
        return Linear()

    def hand_step(model: Any, optimizer: Any, batch: dict[str, Any]) -> None:
        model(batch["x"], batch["target"])["loss"].backward()
        optimizer.step()
        optimizer.clear_grad()

    def weighted(dataset: SyntheticImages) -> DataLoader:
        sampler = WeightedRandomSampler(np.linspace(0.5, 1.0, len(dataset)), len(dataset), replacement=True)
        return DataLoader(dataset, batch_sampler=BatchSampler(sampler=sampler, batch_size=BATCH), num_workers=2,
                          use_shared_memory=True, persistent_workers=True, prefetch_factor=4)

    def close(loader: Any) -> None:
        iterator = getattr(loader, "_iterator", None)
        if iterator is not None:
            iterator._try_shutdown_all()

    return Framework(
        "paddle", paddle.__version__, make_model,
        lambda m: paddle.optimizer.SGD(learning_rate=LR, parameters=m.parameters()), hand_step,
        {
            "num_workers=0": lambda d: DataLoader(d, batch_size=BATCH, shuffle=True),
            "num_workers=2, use_shared_memory, persistent, prefetch_factor=4": lambda d: DataLoader(
                d, batch_size=BATCH, shuffle=True, num_workers=2, use_shared_memory=True, persistent_workers=True,
                prefetch_factor=4),
            "num_workers=2 (not persistent)": lambda d: DataLoader(d, batch_size=BATCH, shuffle=True, num_workers=2),
            "WeightedRandomSampler, num_workers=2, persistent (left alone)": weighted,
        },
        close, device,
    )


def oneflow_framework(device: str) -> Framework:
    import oneflow as flow
    from oneflow.utils.data import DataLoader

    class Linear(flow.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = flow.nn.Linear(FEATURES, CLASSES)

        def forward(self, x: Any, target: Any) -> dict[str, Any]:
            return {"loss": flow.nn.functional.cross_entropy(self.fc(x), target)}

    def make_model() -> Any:
        flow.manual_seed(0)
        return Linear().to(device)

    def hand_step(model: Any, optimizer: Any, batch: dict[str, Any]) -> None:
        model(batch["x"].to(device), batch["target"].to(device))["loss"].backward()
        optimizer.step()
        optimizer.zero_grad()

    def own(dataset: SyntheticImages) -> DataLoader:
        return DataLoader(dataset, BATCH, sampler=OwnSampler(len(dataset)), num_workers=2,
                          persistent_workers=True, prefetch_factor=4)

    def close(loader: Any) -> None:
        iterator = getattr(loader, "_iterator", None)
        if iterator is not None and hasattr(iterator, "_shutdown"):
            iterator._shutdown_workers()

    return Framework(
        "oneflow", flow.__version__, make_model, lambda m: flow.optim.SGD(m.parameters(), lr=LR), hand_step,
        {
            "num_workers=0": lambda d: DataLoader(d, BATCH, shuffle=True),
            "num_workers=2, persistent, prefetch_factor=4": lambda d: DataLoader(
                d, BATCH, shuffle=True, num_workers=2, persistent_workers=True, prefetch_factor=4),
            "num_workers=2 (not persistent)": lambda d: DataLoader(d, BATCH, shuffle=True, num_workers=2),
            "own sampler, num_workers=2, persistent (left alone)": own,
        },
        close, device,
    )


FRAMEWORKS = {"torch": torch_framework, "paddle": paddle_framework, "oneflow": oneflow_framework}


# ----------------------------------------------------------------------- sides
def hand_run(fw: Framework, loader: Any, epochs: int) -> tuple[int, float, Any]:
    """The user's loop over their own loader: (samples, seconds, loader iterated)."""
    model = fw.make_model()
    optimizer = fw.make_optimizer(model)
    samples = 0
    start = time.perf_counter()
    for _ in range(epochs):
        for batch in loader:
            fw.hand_step(model, optimizer, batch)
            samples += len(batch["target"])
    return samples, time.perf_counter() - start, loader


def trainer_run(fw: Framework, loader: Any, epochs: int) -> tuple[int, float, Any]:
    """``Trainer.run()`` on the same kind of loader; building the Trainer (and the rebuilt loader) is not timed."""
    from drivetrain import Trainer

    model = fw.make_model()
    trainer = Trainer(model, loader, fw.make_optimizer(model), driver=fw.name, device=fw.device, n_epochs=epochs,
                      progress_bar=None)
    start = time.perf_counter()
    trainer.run(num_eval_sanity_batch=0)
    seconds = time.perf_counter() - start
    if trainer.global_forward_batches != len(trainer.dataloader) * epochs:
        raise SystemExit(f"the Trainer ran {trainer.global_forward_batches} batches, not {len(loader) * epochs}")
    samples = min(len(loader.dataset), len(trainer.dataloader) * BATCH) * epochs
    return samples, seconds, trainer.dataloader


SIDES = {"hand": hand_run, "trainer": trainer_run}


def cpu_seconds() -> float:
    """CPU time of this process and of its finished children (the loader workers, once stopped and joined)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def measure(fw: Framework, config: str, side: str, dataset: SyntheticImages, epochs: int) -> tuple[float, float]:
    """One run on a fresh loader: (samples/s, CPU µs per sample of the process and its workers).

    The CPU time counts from building the loader to stopping its workers: every sample loaded, wasted or
    not, and every worker started, whatever else the machine runs; a steadier view than the wall time.
    """
    cpu = cpu_seconds()
    loader = fw.configs[config](dataset)
    samples, seconds, iterated = SIDES[side](fw, loader, epochs)
    fw.close(iterated)
    fw.close(loader)  # oneflow starts a persistent loader's workers when it is built, even if never iterated
    del loader, iterated
    gc.collect()
    return samples / seconds, (cpu_seconds() - cpu) / samples * 1e6


def run_config(fw: Framework, config: str, dataset: SyntheticImages, epochs: int, rounds: int) -> dict[str, Any]:
    measure(fw, config, "hand", SyntheticImages(4 * BATCH), 1)  # warm-up: imports, first worker start
    measure(fw, config, "trainer", SyntheticImages(4 * BATCH), 1)
    per_side: dict[str, list[float]] = {side: [] for side in SIDES}
    cpu: dict[str, list[float]] = {side: [] for side in SIDES}
    for r in range(rounds):
        for side in SIDES if r % 2 == 0 else reversed(SIDES):
            rate, cpu_us = measure(fw, config, side, dataset, epochs)
            per_side[side].append(rate)
            cpu[side].append(cpu_us)
    hand, trainer = (statistics.median(per_side[s]) for s in ("hand", "trainer"))
    paired = statistics.median(t / h for t, h in zip(per_side["trainer"], per_side["hand"], strict=True))
    cpu_hand, cpu_trainer = (statistics.median(cpu[s]) for s in ("hand", "trainer"))
    return {"config": config, "hand": hand, "trainer": trainer, "ratio": trainer / hand, "paired": paired,
            "cpu_hand": cpu_hand, "cpu_trainer": cpu_trainer, "per_round": per_side}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--framework", choices=sorted(FRAMEWORKS), default="torch")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--samples", type=int, default=2048)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--only", default="", help="run the configurations whose name contains this")
    args = parser.parse_args(argv)
    fw = FRAMEWORKS[args.framework](args.device)
    dataset = SyntheticImages(args.samples)
    print(f"{fw.name} {fw.version}, device {fw.device}, {os.cpu_count()} CPUs, python {sys.version.split()[0]}; "
          f"{args.samples} samples x {args.epochs} epochs, batch {BATCH}, {args.rounds} rounds; "
          f"__getitem__ {sample_cost_us(dataset):.0f} µs/sample (wall); load {os.getloadavg()[0]:.2f}")
    print("\n| config | hand samples/s | trainer samples/s | trainer/hand (medians) | paired "
          "| CPU µs/sample hand | trainer | trainer/hand |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for config in (c for c in fw.configs if args.only in c):
        row = run_config(fw, config, dataset, args.epochs, args.rounds)
        print(f"| {config} | {row['hand']:.0f} | {row['trainer']:.0f} | {row['ratio']:.3f} | {row['paired']:.3f} "
              f"| {row['cpu_hand']:.0f} | {row['cpu_trainer']:.0f} | {row['cpu_trainer'] / row['cpu_hand']:.3f} |",
              flush=True)
    print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
