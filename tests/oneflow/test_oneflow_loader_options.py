"""A oneflow DataLoader's worker settings survive the Trainer's reproducible rebuild (issue 17, data loading).

oneflow's DataLoader mirrors torch's, workers included (they work on this machine's CPU
build, oneflow 0.9). The Trainer swaps a loader's default sampling for a resumable batch sampler by building a
new DataLoader; these tests train through ``Trainer.run`` and look at the loader it
iterated (``trainer.dataloader``): every worker setting is kept, the workers persist
across epochs, each sample is read once per epoch, the order is the one of
``num_workers=0`` for the same seed, and a user's own sampler is left alone.
"""

from __future__ import annotations

import multiprocessing
import os
from typing import Any

import numpy as np
import pytest

flow = pytest.importorskip("oneflow")
from oneflow.utils.data import DataLoader, Dataset, get_worker_info  # noqa: E402
from oneflow.utils.data.dataloader import default_collate  # noqa: E402

from drivetrain import Trainer  # noqa: E402
from drivetrain.backend import find_reproducible_sampler  # noqa: E402
from drivetrain_oneflow._dataloader import reproducible_dataloader  # noqa: E402

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
    batch["collated"] = np.ones(1, np.float32)  # numpy: flow.ones in a forked worker hangs it (oneflow 0.9)
    return batch


class Recorder(flow.nn.Module):
    """A tiny classifier that records, per batch, the indices, worker pids and flags it was fed."""

    def __init__(self) -> None:
        super().__init__()
        flow.manual_seed(0)
        self.fc = flow.nn.Linear(4, 2)
        self.seen: list[dict[str, Any]] = []

    def forward(self, x: flow.Tensor, y: flow.Tensor, index: flow.Tensor, pid: flow.Tensor,
                initialised: flow.Tensor, collated: flow.Tensor | None = None) -> dict[str, flow.Tensor]:
        record(self.seen, index.tolist(), pid.tolist(), initialised.tolist(), collated)
        return {"loss": flow.nn.functional.cross_entropy(self.fc(x), y)}


def train(loader: DataLoader, n_epochs: int = 2) -> tuple[Trainer, Recorder]:
    model = Recorder()
    trainer = Trainer(model, loader, flow.optim.SGD(model.parameters(), lr=0.1), driver="oneflow", device="cpu",
                      n_epochs=n_epochs, progress_bar=None)
    trainer.run(num_eval_sanity_batch=0)
    return trainer, model


def shut_down(loader: Any) -> None:
    """Stop a loader's persistent workers now rather than at garbage collection."""
    iterator = getattr(loader, "_iterator", None)
    if iterator is not None and hasattr(iterator, "_shutdown"):  # absent when the iterator failed to start
        iterator._shutdown_workers()


def seeded_generator(seed: int) -> Any:
    generator = flow.Generator("cpu")
    generator.manual_seed(seed)
    return generator


class OwnSampler:
    """A user's own sampler (a reshuffled permutation per epoch): the Trainer leaves it alone."""

    def __init__(self, n: int) -> None:
        self.n, self.rng = n, np.random.default_rng(3)

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Any:
        return iter(self.rng.permutation(self.n).tolist())


def worker_loader(**extra: Any) -> DataLoader:
    options: dict[str, Any] = {
        "batch_size": BATCH, "shuffle": True, "num_workers": 2, "persistent_workers": True, "prefetch_factor": 3,
        "pin_memory": False, "timeout": 20, "worker_init_fn": mark_initialised, "multiprocessing_context": multiprocessing.get_context("fork"),
        "collate_fn": tagging_collate, "generator": seeded_generator(7),
    }
    options = {**options, **extra}
    if options["generator"] is None:
        del options["generator"]  # oneflow's default: the generator every DataLoader shares
    return DataLoader(Tagged(), **options)


def test_worker_settings_survive_the_rebuild_and_training() -> None:
    loader = worker_loader()
    trainer, model = train(loader)
    rebuilt = trainer.dataloader
    try:
        assert rebuilt is not loader and type(rebuilt) is DataLoader
        assert find_reproducible_sampler(rebuilt) is not None
        check_settings_kept(loader, rebuilt, (
            "dataset", "num_workers", "persistent_workers", "prefetch_factor", "pin_memory", "timeout",
            "worker_init_fn", "collate_fn",
        ))
        assert rebuilt.multiprocessing_context is loader.multiprocessing_context
        # Unlike torch, the user's generator is not kept: its seed decides the order (see the order test) and the
        # rebuilt loader gets a generator of its own, reseeded per epoch, for the workers' base seed.
        assert rebuilt.generator is not loader.generator
        assert rebuilt.multiprocessing_context.get_start_method() == "fork"
        assert all(b["initialised"] == {1} and b["collated"] for b in model.seen)  # worker_init_fn, collate_fn ran
    finally:
        shut_down(rebuilt)
        shut_down(loader)  # oneflow started the user's persistent workers when the loader was built


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
        flow.manual_seed(11)
        extra: dict[str, Any] = {"num_workers": workers}
        if workers == 0:
            extra.update(persistent_workers=False, prefetch_factor=2, timeout=0, multiprocessing_context=None)
        if not generator:
            extra["generator"] = None
        trainer, model = train(worker_loader(**extra))
        shut_down(trainer.dataloader)
        orders.append([b["index"] for b in model.seen])
    assert orders[0] == orders[1]


def test_a_users_sampler_with_workers_is_left_alone() -> None:
    sampler = OwnSampler(N)
    loader = DataLoader(Tagged(), batch_size=BATCH, sampler=sampler, num_workers=2, persistent_workers=True,
                        multiprocessing_context=multiprocessing.get_context("fork"))
    trainer, model = train(loader)
    try:
        check_left_alone(trainer, loader, model.seen)
    finally:
        shut_down(loader)



@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # oneflow's __del__ of the iterator
def test_oneflow_takes_a_context_not_a_start_method_name() -> None:
    """oneflow 0.9 keeps ``multiprocessing_context`` as given and calls ``.Queue()`` on it when the workers start:
    a start-method name (accepted by torch) fails there, with or without drivetrain; pass a context object."""
    loader = DataLoader(Tagged(), batch_size=BATCH, num_workers=2, multiprocessing_context="fork")
    with pytest.raises(AttributeError, match="'str' object has no attribute 'Queue'"):
        iter(loader)


def test_a_persistent_loader_starts_where_its_sampler_was_set() -> None:
    """oneflow builds a persistent loader's iterator (drawing its batches) in the constructor; the rebuilt loader
    must not: the epoch and resume position set on the sampler after the rebuild decide its first iteration."""
    loader = worker_loader(collate_fn=None, worker_init_fn=None)
    rebuilt = reproducible_dataloader(loader)
    sampler = find_reproducible_sampler(rebuilt)
    try:
        assert rebuilt.persistent_workers and rebuilt._iterator is None  # no workers started, no batch drawn yet
        sampler.set_epoch(1)
        expected = sampler.order().tolist()
        assert sum((b["index"].tolist() for b in rebuilt), []) == expected
        sampler.resume(1, 2 * BATCH)
        assert sum((b["index"].tolist() for b in rebuilt), []) == expected[2 * BATCH:]
    finally:
        shut_down(rebuilt)
        shut_down(loader)
