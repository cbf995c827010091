"""Dataloader views the loop needs: truncated epochs and overfitting on a few batches."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any


def loader_length(dataloader: Any) -> int | None:
    """``len(dataloader)`` or None for an iterable without a length."""
    try:
        return len(dataloader)
    except TypeError:
        return None


class TruncatedLoader:
    """Yields at most ``num_batches`` batches of ``dataloader`` per pass (``num_train_batch_per_epoch``)."""

    def __init__(self, dataloader: Any, num_batches: int) -> None:
        self.dataloader = dataloader
        self.num_batches = num_batches

    def __iter__(self) -> Iterator[Any]:
        return itertools.islice(iter(self.dataloader), self.num_batches)

    def __len__(self) -> int:
        length = loader_length(self.dataloader)
        return self.num_batches if length is None else min(length, self.num_batches)

    def __getattr__(self, name: str) -> Any:  # sampler, batch_size, ... of the wrapped loader
        return getattr(self.dataloader, name)


class OverfitLoader:
    """The first ``num_batches`` batches (all when -1), fetched once and replayed every epoch."""

    def __init__(self, dataloader: Any, num_batches: int) -> None:
        source = iter(dataloader)
        self.batches = list(source if num_batches == -1 else itertools.islice(source, num_batches))
        self.dataloader = dataloader

    def __iter__(self) -> Iterator[Any]:
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)
