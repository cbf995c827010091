"""A torch DataLoader's speed settings survive the Trainer's reproducible rebuild (issue 17, data loading).

The Trainer swaps a loader's default sampling for a resumable batch sampler by building a
new DataLoader; these tests train through ``Trainer.run`` and look at the loader it
iterated (``trainer.dataloader``): every worker setting is kept, the workers persist
across epochs, each sample is read once per epoch, the order is the one of
``num_workers=0`` for the same seed, and a user's own sampler is left alone.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, WeightedRandomSampler, default_collate, get_worker_info

from drivetrain import Trainer
from drivetrain.backend import find_reproducible_sampler

from .._loader_checks import (
    BATCH,
    N,
    check_left_alone,
    check_persistent_workers_read_each_sample_once,
    check_settings_kept,
    features,
    record,
)

pytestmark = pytest.mark.timeout(120)


class Tagged(Dataset):
    """Samples that say which process read them and whether the worker_init_fn ran there."""

    def __init__(self) -> None:
        self.initialised = 0
        self.x = features()

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> dict[str, Any]:
        in_worker = get_worker_info() is not None
        return {"x": self.x[i], "y": int(self.x[i, 0] > 0), "index": i, "pid": os.getpid() if in_worker else 0,
                "initialised": self.initialised}


def mark_initialised(worker_id: int) -> None:  # pragma: no cover - runs in the worker processes
    get_worker_info().dataset.initialised = 1


def tagging_collate(samples: list[dict[str, Any]]) -> dict[str, Any]:
    batch = default_collate(samples)
    batch["collated"] = torch.ones(())
    return batch


class Recorder(torch.nn.Module):
    """A tiny classifier that records, per batch, the indices, worker pids and flags it was fed."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(4, 2)
        self.seen: list[dict[str, Any]] = []

    def forward(self, x: torch.Tensor, y: torch.Tensor, index: torch.Tensor, pid: torch.Tensor,
                initialised: torch.Tensor, collated: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        record(self.seen, index.tolist(), pid.tolist(), initialised.tolist(), collated)
        return {"loss": torch.nn.functional.cross_entropy(self.fc(x), y)}


def train(loader: DataLoader, n_epochs: int = 2) -> tuple[Trainer, Recorder]:
    model = Recorder()
    trainer = Trainer(model, loader, torch.optim.SGD(model.parameters(), lr=0.1), driver="torch", device="cpu",
                      n_epochs=n_epochs, progress_bar=None)
    trainer.run(num_eval_sanity_batch=0)
    return trainer, model


def shut_down(loader: Any) -> None:
    """Stop a loader's persistent workers now rather than at garbage collection."""
    iterator = getattr(loader, "_iterator", None)
    if iterator is not None and hasattr(iterator, "_shutdown_workers"):
        iterator._shutdown_workers()


def worker_loader(**extra: Any) -> DataLoader:
    options: dict[str, Any] = {
        "batch_size": BATCH, "shuffle": True, "num_workers": 2, "persistent_workers": True, "prefetch_factor": 3,
        "pin_memory": False, "timeout": 60, "worker_init_fn": mark_initialised, "multiprocessing_context": "fork",
        "collate_fn": tagging_collate, "generator": torch.Generator().manual_seed(7),
    }
    return DataLoader(Tagged(), **{**options, **extra})


def test_worker_settings_survive_the_rebuild_and_training() -> None:
    loader = worker_loader()
    trainer, model = train(loader)
    rebuilt = trainer.dataloader
    try:
        assert rebuilt is not loader and type(rebuilt) is DataLoader
        assert find_reproducible_sampler(rebuilt) is not None
        check_settings_kept(loader, rebuilt, (
            "dataset", "num_workers", "persistent_workers", "prefetch_factor", "pin_memory", "timeout",
            "worker_init_fn", "collate_fn", "generator", "pin_memory_device", "in_order",
        ))
        assert rebuilt.multiprocessing_context is loader.multiprocessing_context
        assert rebuilt.multiprocessing_context.get_start_method() == "fork"
        assert all(b["initialised"] == {1} and b["collated"] for b in model.seen)  # worker_init_fn, collate_fn ran
        assert loader._iterator is None  # the user's own loader never started workers
    finally:
        shut_down(rebuilt)


def test_workers_persist_and_each_sample_is_read_once_per_epoch() -> None:
    trainer, model = train(worker_loader())
    try:
        pids = check_persistent_workers_read_each_sample_once(model.seen)
        assert {w.pid for w in trainer.dataloader._iterator._workers} == pids
    finally:
        shut_down(trainer.dataloader)


@pytest.mark.parametrize("generator", [True, False], ids=["users-generator", "global-seed"])
def test_order_with_workers_equals_order_without(generator: bool) -> None:
    """Reproducible sampling survives workers: the same seed gives the same batches with 0 or 2 workers."""
    orders = []
    for workers in (0, 2):
        torch.manual_seed(11)
        extra: dict[str, Any] = {"num_workers": workers}
        if workers == 0:
            extra.update(persistent_workers=False, prefetch_factor=None, timeout=0, multiprocessing_context=None)
        if not generator:
            extra["generator"] = None
        trainer, model = train(worker_loader(**extra))
        shut_down(trainer.dataloader)
        orders.append([b["index"] for b in model.seen])
    assert orders[0] == orders[1]


def test_a_users_sampler_with_workers_is_left_alone() -> None:
    weights = torch.linspace(0.1, 1.0, N)
    sampler = WeightedRandomSampler(weights, num_samples=N, replacement=True, generator=torch.Generator().manual_seed(3))
    loader = DataLoader(Tagged(), batch_size=BATCH, sampler=sampler, num_workers=2, persistent_workers=True,
                        multiprocessing_context="fork")
    trainer, model = train(loader)
    try:
        check_left_alone(trainer, loader, model.seen)
    finally:
        shut_down(loader)

