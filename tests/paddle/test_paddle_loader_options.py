"""A paddle.io.DataLoader's worker settings survive the Trainer's reproducible rebuild (issue 17, data loading).

The Trainer swaps the default sampling of a plain ``paddle.io.DataLoader`` for a resumable
batch sampler by building a new loader; these tests train through ``Trainer.run`` and look
at the loader it iterated (``trainer.dataloader``): the worker settings are kept, the
persistent workers serve both epochs, each sample is read once per epoch, the order is the
one of ``num_workers=0`` for the same seed, and a user's own sampler is left alone.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

paddle = pytest.importorskip("paddle")
from paddle.io import BatchSampler, DataLoader, Dataset, WeightedRandomSampler, get_worker_info  # noqa: E402
from paddle.io.dataloader.collate import default_collate_fn  # noqa: E402

from drivetrain import Trainer  # noqa: E402
from drivetrain.backend import find_reproducible_sampler  # noqa: E402

from .._loader_checks import (  # noqa: E402
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
    """numpy samples (paddle tensors crash paddle's workers) saying which process read them."""

    def __init__(self) -> None:
        self.initialised = 0
        self.x = features()

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> dict[str, Any]:
        pid = os.getpid() if get_worker_info() is not None else 0
        return {"x": self.x[i], "y": np.int64(self.x[i, 0] > 0), "index": np.int64(i), "pid": np.int64(pid),
                "initialised": np.int64(self.initialised)}


def mark_initialised(worker_id: int) -> None:  # pragma: no cover - runs in the worker processes
    get_worker_info().dataset.initialised = 1


def tagging_collate(samples: list[dict[str, Any]]) -> dict[str, Any]:
    batch = default_collate_fn(samples)
    batch["collated"] = np.ones(1, np.float32)  # numpy: a paddle tensor made in a worker crashes it
    return batch


class Recorder(paddle.nn.Layer):
    """A tiny classifier that records, per batch, the indices, worker pids and flags it was fed."""

    def __init__(self) -> None:
        super().__init__()
        paddle.seed(0)
        self.fc = paddle.nn.Linear(4, 2)
        self.seen: list[dict[str, Any]] = []

    def forward(self, x: Any, y: Any, index: Any, pid: Any, initialised: Any, collated: Any = None) -> dict[str, Any]:
        record(self.seen, index.numpy().tolist(), pid.numpy().tolist(), initialised.numpy().tolist(), collated)
        return {"loss": paddle.nn.functional.cross_entropy(self.fc(x), y)}


def train(loader: DataLoader, n_epochs: int = 2) -> tuple[Trainer, Recorder]:
    model = Recorder()
    optimizer = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
    trainer = Trainer(model, loader, optimizer, driver="paddle", device="cpu", n_epochs=n_epochs, progress_bar=None)
    trainer.run(num_eval_sanity_batch=0)
    return trainer, model


def shut_down(loader: Any) -> None:
    """Stop a loader's persistent workers now rather than at garbage collection."""
    iterator = getattr(loader, "_iterator", None)
    if iterator is not None:
        iterator._try_shutdown_all()


def worker_loader(**extra: Any) -> DataLoader:
    options: dict[str, Any] = {
        "batch_size": BATCH, "shuffle": True, "num_workers": 2, "persistent_workers": True, "prefetch_factor": 3,
        "use_shared_memory": True, "timeout": 60, "worker_init_fn": mark_initialised, "collate_fn": tagging_collate,
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
            "dataset", "num_workers", "_persistent_workers", "prefetch_factor", "use_shared_memory", "timeout",
            "worker_init_fn", "collate_fn", "return_list", "use_buffer_reader",
        ))
        assert rebuilt._persistent_workers is True
        assert all(b["initialised"] == {1} and b["collated"] for b in model.seen)  # worker_init_fn, collate_fn ran
        assert loader._iterator is None  # the user's own loader never started workers
    finally:
        shut_down(rebuilt)


def test_workers_persist_and_each_sample_is_read_once_per_epoch() -> None:
    trainer, model = train(worker_loader())
    try:
        check_persistent_workers_read_each_sample_once(model.seen)
    finally:
        shut_down(trainer.dataloader)


def test_order_with_workers_equals_order_without() -> None:
    """The shuffling seed is drawn from numpy's global generator: the same seed, the same batches, 0 or 2 workers."""
    orders = []
    for workers in (0, 2):
        np.random.seed(11)
        trainer, model = train(worker_loader(num_workers=workers, persistent_workers=workers > 0))
        shut_down(trainer.dataloader)
        orders.append([b["index"] for b in model.seen])
    assert orders[0] == orders[1]


def test_a_users_sampler_with_workers_is_left_alone() -> None:
    sampler = WeightedRandomSampler(np.linspace(0.1, 1.0, N), N, replacement=True)
    loader = DataLoader(Tagged(), batch_sampler=BatchSampler(sampler=sampler, batch_size=BATCH), num_workers=2,
                        persistent_workers=True)
    trainer, model = train(loader)
    try:
        check_left_alone(trainer, loader, model.seen)
    finally:
        shut_down(loader)

