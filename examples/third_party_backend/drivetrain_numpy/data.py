"""A minimal dataloader over a dict of equally long numpy arrays."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np


class ArrayLoader:
    def __init__(self, arrays: dict[str, np.ndarray], batch_size: int = 8, shuffle: bool = False,
                 seed: int = 0, drop_last: bool = False, batch_sampler: Any = None) -> None:
        lengths = {len(v) for v in arrays.values()}
        if len(lengths) != 1:
            raise ValueError(f"arrays have different lengths: { {k: len(v) for k, v in arrays.items()} }")
        self.arrays = arrays
        self.n = lengths.pop()
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.seed = seed
        self.epoch = 0
        self.batch_sampler = batch_sampler

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        if self.batch_sampler is not None:
            self.batch_sampler.set_epoch(epoch)

    def __len__(self) -> int:
        if self.batch_sampler is not None:
            return len(self.batch_sampler)
        return self.n // self.batch_size if self.drop_last else -(-self.n // self.batch_size)

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        if self.batch_sampler is not None:
            for idx in self.batch_sampler:
                yield {k: v[idx] for k, v in self.arrays.items()}
            return
        order = np.arange(self.n)
        if self.shuffle:
            np.random.default_rng(self.seed + self.epoch).shuffle(order)
        for i in range(len(self)):
            idx = order[i * self.batch_size:(i + 1) * self.batch_size]
            yield {k: v[idx] for k, v in self.arrays.items()}
