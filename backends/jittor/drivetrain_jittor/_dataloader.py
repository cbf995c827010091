"""Data for the jittor backend: a jittor ``Dataset`` read through drivetrain's resumable samplers.

A ``jittor.dataset.Dataset`` is its own loader (``set_attrs(batch_size=, shuffle=)``),
and it shuffles with a generator of its own seeded with a constant, cannot start in the
middle of an epoch, and under MPI splits each batch over the processes by itself. For
sample-exact resume and for data-parallel training the driver reads the dataset through
:class:`DatasetLoader` instead: the same ``dataset[i]``, ``collate_batch`` and
``to_jittor`` as jittor, with indices from drivetrain's
:class:`~drivetrain.ReproducibleBatchSampler` (order fixed by a saved seed, starts
mid-epoch in O(1); under MPI each process takes its part of every batch) or, for
distributed evaluation, an :class:`~drivetrain.backend.UnrepeatedBatchSampler`.

Batch size under MPI follows jittor: ``batch_size`` is the global batch, and each of
the N processes reads ``batch_size / N`` samples of it (N must divide it). Batches are
read in the main process; a dataset with ``num_workers > 0`` is read without workers
(the driver warns once). A dataset with its own ``sampler``, and plain iterables of
batches, keep their own order (they cannot be resumed mid-epoch, nor shared out).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from drivetrain.backend import DriverError, ReproducibleBatchSampler, UnrepeatedBatchSampler


class DatasetLoader:
    """Iterates a jittor Dataset in the batches a drivetrain batch sampler gives.

    ``batch_sampler`` is public: the Trainer finds the reproducible sampler there to
    save and restore the position in the epoch.
    """

    def __init__(self, dataset: Any, batch_sampler: Any) -> None:
        self.dataset = dataset
        self.batch_sampler = batch_sampler

    def __iter__(self) -> Iterator[Any]:
        dataset = self.dataset
        for indices in self.batch_sampler:
            yield dataset.to_jittor(dataset.collate_batch([dataset[int(i)] for i in indices]))

    def __len__(self) -> int:
        return len(self.batch_sampler)

    def __repr__(self) -> str:
        return f"DatasetLoader({type(self.dataset).__name__}, {type(self.batch_sampler).__name__})"


def is_jittor_dataset(obj: Any) -> bool:
    import jittor

    return isinstance(obj, jittor.dataset.Dataset)


def dataset_size(dataset: Any) -> int:
    """Samples in a jittor Dataset: ``total_len`` if set, else the user's ``__len__`` (jittor's own rule)."""
    try:
        return int(dataset.__real_len__())
    except Exception as exc:  # noqa: BLE001 - a dataset without a size: say which and how to fix
        raise DriverError(
            f"the jittor Dataset {type(dataset).__name__} has no size: call self.set_attrs(total_len=N) in its "
            f"__init__ (or define __len__ returning the number of samples). ({type(exc).__name__}: {exc})"
        ) from exc


def shareable(dataset: Any) -> bool:
    """Whether ``dataset`` is a jittor Dataset that samples the default way (shuffle or in order), so that its
    sampling can be replaced (a :class:`DatasetLoader` already is: it is not a jittor Dataset)."""
    return is_jittor_dataset(dataset) and getattr(dataset, "sampler", None) is None


def per_process_batch(dataset: Any, world_size: int, argument: str) -> int:
    """``batch_size / world_size``: jittor's global batch split over the MPI processes."""
    batch_size = int(dataset.batch_size)
    if batch_size < 1:
        raise DriverError(f"{argument}: the jittor Dataset has batch_size={batch_size}; set a batch_size >= 1.")
    if batch_size % world_size:
        low = max(world_size, batch_size // world_size * world_size)
        raise DriverError(
            f"{argument}: batch_size={batch_size} is the global batch under MPI (jittor's convention: each of the "
            f"{world_size} processes reads batch_size / {world_size} samples), and {world_size} does not divide it; "
            f"set_attrs(batch_size={low}) or {low + world_size}, or run another number of processes."
        )
    return batch_size // world_size


_warned_workers: set[int] = set()


def _warn_workers(dataset: Any) -> None:
    workers = int(getattr(dataset, "num_workers", 0) or 0)
    if workers > 0 and id(dataset) not in _warned_workers:
        _warned_workers.add(id(dataset))
        warnings.warn(
            f"the jittor Dataset {type(dataset).__name__} has num_workers={workers}, but drivetrain reads it in the "
            "main process so that its order can be resumed (and shared out under MPI); the workers are not used. "
            "In a single process, Trainer(..., reproducible_sampler=False) keeps jittor's own loading.",
            UserWarning,
            stacklevel=5,
        )


def reproducible_loader(dataset: Any, *, num_replicas: int, rank: int, batch_size: int,
                        agree_seed: Callable[[int], int] | None = None) -> DatasetLoader:
    """A :class:`DatasetLoader` over ``dataset`` with a :class:`ReproducibleBatchSampler`.

    The seed is drawn from numpy's global generator (``seed_everything`` fixes it; jittor's
    own Dataset would have used a constant), then made the same on every process by
    ``agree_seed`` (a broadcast from rank 0).
    """
    _warn_workers(dataset)
    seed = int(np.random.randint(2**31))
    if agree_seed is not None:
        seed = agree_seed(seed)
    sampler = ReproducibleBatchSampler(dataset_size(dataset), batch_size, shuffle=bool(dataset.shuffle),
                                       drop_last=bool(dataset.drop_last), seed=seed, num_replicas=num_replicas,
                                       rank=rank)
    return DatasetLoader(dataset, sampler)


def unrepeated_loader(dataset: Any, *, num_replicas: int, rank: int, batch_size: int) -> DatasetLoader:
    """A :class:`DatasetLoader` reading rank ``rank``'s contiguous shard once (evaluation)."""
    _warn_workers(dataset)
    size = dataset_size(dataset)
    if dataset.drop_last:
        size -= size % int(dataset.batch_size)
    return DatasetLoader(dataset, UnrepeatedBatchSampler(size, batch_size, num_replicas=num_replicas, rank=rank))


def describe(dataloader: Any) -> str:
    """Why a dataloader's sampling cannot be replaced, in words."""
    if is_jittor_dataset(dataloader):
        return f"it has its own sampler ({type(dataloader.sampler).__name__})"
    if isinstance(dataloader, DatasetLoader):
        return "it is already a drivetrain DatasetLoader with another sampler"
    return (f"it is a {type(dataloader).__module__}.{type(dataloader).__qualname__}, not a jittor Dataset, so there "
            "are no sample indices to share out")
