"""Data for JAX models without any other framework: a map-style dataset in numpy batches.

:class:`DataLoader` batches any dataset with ``len()`` and ``[index]`` (returning numpy arrays, numbers, or
dicts, tuples and lists of them) with :func:`numpy_collate`. The Trainer replaces its order with a
``ReproducibleBatchSampler`` (sample-exact resume, each process its share of every global batch), as it does
for a torch ``DataLoader(..., collate_fn=numpy_collate)``, which works too.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np


def numpy_collate(samples: list[Any]) -> Any:
    """Samples stacked into one batch of numpy arrays, through dicts, tuples, lists and namedtuples."""
    first = samples[0]
    if isinstance(first, Mapping):
        return {key: numpy_collate([sample[key] for sample in samples]) for key in first}
    if isinstance(first, tuple) and hasattr(first, "_fields"):
        return type(first)(*(numpy_collate(list(column)) for column in zip(*samples, strict=True)))
    if isinstance(first, (tuple, list)):
        return type(first)(numpy_collate(list(column)) for column in zip(*samples, strict=True))
    return np.stack([np.asarray(sample) for sample in samples])


class DataLoader:
    """Batches of a map-style ``dataset`` (``len(dataset)``, ``dataset[i]``), collated by ``collate_fn``.

    Args:
        dataset: any object with ``__len__`` and ``__getitem__`` returning numpy data.
        batch_size: samples per batch.
        shuffle: a new order every epoch (drawn from ``seed`` and the epoch).
        drop_last: leave out a last batch shorter than ``batch_size``.
        collate_fn: ``collate_fn(samples) -> batch``; default :func:`numpy_collate`.
        seed: the shuffling seed; default: drawn from Python's ``random`` (so ``seed_everything`` decides it).
        batch_sampler: an iterable of index lists replacing the order above (the Trainer installs one).
    """

    def __init__(self, dataset: Any, batch_size: int = 1, *, shuffle: bool = False, drop_last: bool = False,
                 collate_fn: Callable[[list[Any]], Any] | None = None, seed: int | None = None,
                 batch_sampler: Any = None) -> None:
        if not hasattr(dataset, "__len__") or not hasattr(dataset, "__getitem__"):
            raise TypeError(f"DataLoader(dataset={type(dataset).__name__}): the dataset needs __len__ and "
                            "__getitem__ (a map-style dataset); give an iterable of batches to the Trainer directly.")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"DataLoader(batch_size={batch_size!r}) must be a positive int.")
        self.dataset = dataset
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.collate_fn = collate_fn or numpy_collate
        self.seed = random.randrange(2**31) if seed is None else int(seed)
        self.batch_sampler = batch_sampler
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """The epoch whose order comes next (a new shuffle every epoch)."""
        self.epoch = epoch

    def with_batch_sampler(self, batch_sampler: Any) -> DataLoader:
        """A loader over the same dataset and collate function iterating ``batch_sampler``."""
        return DataLoader(self.dataset, self.batch_size, shuffle=self.shuffle, drop_last=self.drop_last,
                          collate_fn=self.collate_fn, seed=self.seed, batch_sampler=batch_sampler)

    def __len__(self) -> int:
        if self.batch_sampler is not None:
            return len(self.batch_sampler)
        whole, rest = divmod(len(self.dataset), self.batch_size)
        return whole + (1 if rest and not self.drop_last else 0)

    def _indices(self) -> Iterator[Any]:
        order = np.arange(len(self.dataset))
        if self.shuffle:
            np.random.default_rng([self.seed, self.epoch]).shuffle(order)
        for i in range(len(self)):
            yield order[i * self.batch_size:(i + 1) * self.batch_size]

    def __iter__(self) -> Iterator[Any]:
        for indices in self.batch_sampler if self.batch_sampler is not None else self._indices():
            yield self.collate_fn([self.dataset[int(i)] for i in indices])
