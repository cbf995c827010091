"""A batch sampler whose order depends only on (seed, epoch) and that can start mid-epoch in O(1).

Drivers put it in place of a dataloader's default sampler so that resume is
sample-exact: the checkpoint records the seed, the epoch and how many samples of
that epoch were consumed, and the resumed sampler starts at that offset of the
same permutation without loading and dropping the batches before it.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import numpy as np

from ._errors import ConfigurationError


class ReproducibleBatchSampler:
    """Yields lists of dataset indices, ``batch_size`` at a time, shuffled per epoch from ``seed``.

    ``seed=None`` draws one from python's ``random`` (so ``seed_everything`` fixes it);
    the seed is saved in checkpoints either way.
    """

    def __init__(self, dataset_len: int, batch_size: int, *, shuffle: bool, drop_last: bool = False,
                 seed: int | None = None) -> None:
        for name, value, minimum in (("dataset_len", dataset_len, 0), ("batch_size", batch_size, 1)):
            if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
                raise ConfigurationError(f"ReproducibleBatchSampler({name}={value!r}): must be an int >= {minimum}.")
        self.dataset_len = dataset_len
        self.batch_size = batch_size
        self.shuffle = bool(shuffle)
        self.drop_last = bool(drop_last)
        self.seed = random.randrange(2**31) if seed is None else int(seed)
        self.epoch = 0
        self._start = 0  # samples of the current epoch already consumed (set on resume)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch's permutation; a new epoch starts from its first sample."""
        if epoch != self.epoch:
            self.epoch = epoch
            self._start = 0

    def resume(self, epoch: int, consumed_samples: int) -> None:
        """Make the next iteration start ``consumed_samples`` into ``epoch``'s order."""
        self.epoch = epoch
        self._start = max(0, min(int(consumed_samples), self.dataset_len))

    def consumed_samples(self, batches_done: int) -> int:
        return min(batches_done * self.batch_size, self.dataset_len)

    def order(self) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.dataset_len)
        return np.random.default_rng([self.seed, self.epoch]).permutation(self.dataset_len)

    def __iter__(self) -> Iterator[list[int]]:
        order = self.order()
        start, self._start = self._start, 0
        end = self.dataset_len - (self.dataset_len % self.batch_size if self.drop_last else 0)
        for i in range(start, end, self.batch_size):
            yield order[i:i + self.batch_size].tolist()

    def __len__(self) -> int:
        """Batches in a whole epoch (a resumed epoch yields fewer)."""
        full, rest = divmod(self.dataset_len, self.batch_size)
        return full if self.drop_last or not rest else full + 1

    def state_dict(self) -> dict[str, Any]:
        return {"seed": self.seed, "shuffle": self.shuffle, "batch_size": self.batch_size,
                "drop_last": self.drop_last, "dataset_len": self.dataset_len}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take the saved seed; the data layout must be the one the checkpoint was taken with."""
        for key in ("shuffle", "batch_size", "drop_last", "dataset_len"):
            if state.get(key) != getattr(self, key):
                raise ConfigurationError(
                    f"the checkpoint's sampler had {key}={state.get(key)!r} but this dataloader has "
                    f"{key}={getattr(self, key)!r}; resume with the same dataset and batch settings."
                )
        self.seed = int(state["seed"])


def find_reproducible_sampler(dataloader: Any) -> ReproducibleBatchSampler | None:
    """The reproducible sampler a driver installed in ``dataloader``, if any."""
    for attr in ("batch_sampler", "sampler"):
        candidate = getattr(dataloader, attr, None)
        if isinstance(candidate, ReproducibleBatchSampler):
            return candidate
    return None
