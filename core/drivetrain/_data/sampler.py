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

from .._common import ConfigurationError


def _check_layout(owner: str, dataset_len: Any, batch_size: Any, num_replicas: Any, rank: Any) -> None:
    for name, value, minimum in (("dataset_len", dataset_len, 0), ("batch_size", batch_size, 1),
                                 ("num_replicas", num_replicas, 1), ("rank", rank, 0)):
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise ConfigurationError(f"{owner}({name}={value!r}): must be an int >= {minimum}.")
    if rank >= num_replicas:
        raise ConfigurationError(f"{owner}(rank={rank}, num_replicas={num_replicas}): rank must be < num_replicas.")


class ReproducibleBatchSampler:
    """Yields lists of dataset indices, ``batch_size`` at a time, shuffled per epoch from ``seed``.

    ``seed=None`` draws one from python's ``random`` (so ``seed_everything`` fixes it);
    the seed is saved in checkpoints either way.

    Distributed (``num_replicas`` > 1): global batch ``g`` is the slice
    ``order[g*B*W:(g+1)*B*W]`` and rank ``r`` takes its ``r``-th part of ``B`` samples,
    so a step sees the same samples as one process with batch ``B*W`` and a resume
    with another world size continues from the same global sample offset. Every rank
    yields the same number of batches (collectives would hang otherwise): the last
    global batch is split evenly, padding with samples from the start of the order
    unless ``drop_last``; ``even_batches=True`` refuses data sizes that would need it
    (with ``drop_last`` nothing is padded, so any size is accepted).

    Args:
        dataset_len: samples in the dataset.
        batch_size: samples per batch on each process.
        shuffle: draw a new order every epoch (else ``0..dataset_len-1``).
        drop_last: leave out the last, incomplete global batch.
        seed: the seed of the orders (None: drawn from python's ``random``).
        num_replicas: processes sharing the data.
        rank: this process's rank among them.
        even_batches: refuse a dataset size that would need padding.

    Raises:
        ConfigurationError: a size or rank out of range, or an uneven size under ``even_batches``.
    """

    def __init__(self, dataset_len: int, batch_size: int, *, shuffle: bool, drop_last: bool = False,
                 seed: int | None = None, num_replicas: int = 1, rank: int = 0, even_batches: bool = False) -> None:
        _check_layout("ReproducibleBatchSampler", dataset_len, batch_size, num_replicas, rank)
        self.dataset_len = dataset_len
        self.batch_size = batch_size
        self.shuffle = bool(shuffle)
        self.drop_last = bool(drop_last)
        self.seed = random.randrange(2**31) if seed is None else int(seed)
        self.num_replicas = num_replicas
        self.rank = rank
        self.epoch = 0
        self._start = 0  # samples of the current epoch already consumed, all ranks together
        self._epoch_start_offset = 0  # where the running iteration started (consumed_samples counts from it)
        if even_batches and not drop_last and dataset_len % (batch_size * num_replicas):
            raise ConfigurationError(
                f"even_batches=True but the dataset has {dataset_len} samples, not a multiple of batch_size "
                f"{batch_size} x {num_replicas} processes; drop the remainder (drop_last=True), pad the "
                "dataset, or allow uneven last batches."
            )

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch's permutation; a new epoch starts from its first sample.

        Args:
            epoch: the epoch index (0-based).
        """
        if epoch != self.epoch:
            self.epoch = epoch
            self._start = 0
            self._epoch_start_offset = 0

    def resume(self, epoch: int, consumed_samples: int) -> None:
        """Make the next iteration start ``consumed_samples`` into ``epoch``'s order.

        Args:
            epoch: the epoch to resume.
            consumed_samples: samples of it already consumed by all ranks together.
        """
        self.epoch = epoch
        self._start = max(0, min(int(consumed_samples), self.dataset_len))
        self._epoch_start_offset = self._start

    @property
    def global_batch_size(self) -> int:
        """Samples per step over all ranks: ``batch_size * num_replicas``."""
        return self.batch_size * self.num_replicas

    def consumed_samples(self, batches_since_start: int) -> int:
        """Samples of the epoch consumed by all ranks once each took ``batches_since_start`` batches.

        Args:
            batches_since_start: batches of the running iteration (which may itself have started
                mid-epoch after a resume).

        Returns:
            The epoch's consumed samples, at most ``dataset_len``.
        """
        return min(self._epoch_start_offset + batches_since_start * self.global_batch_size, self.dataset_len)

    def _batches_from(self, offset: int) -> int:
        full, rest = divmod(max(0, self.dataset_len - offset), self.global_batch_size)
        return full if self.drop_last or not rest else full + 1

    def batch_index_at(self, consumed_samples: int) -> int:
        """The batch index (in this sampler's layout) an epoch resumed ``consumed_samples`` in starts at.

        ``len(self)`` minus the batches left from that offset: a checkpoint taken at another world
        size (another global batch) maps to the batch count of this layout, so the epoch still ends
        after ``len(self)`` batches and every remaining sample is seen once.

        Args:
            consumed_samples: samples of the epoch consumed, all ranks together.

        Returns:
            The index of the first batch still to come.
        """
        return len(self) - self._batches_from(max(0, min(int(consumed_samples), self.dataset_len)))

    def order(self) -> np.ndarray:
        """The epoch's sample order before sharding.

        Returns:
            A permutation drawn from ``(seed, epoch)`` when shuffling (the same on every rank and after a
            resume), else ``0..dataset_len-1``.
        """
        if not self.shuffle:
            return np.arange(self.dataset_len)
        return np.random.default_rng([self.seed, self.epoch]).permutation(self.dataset_len)

    def __iter__(self) -> Iterator[list[int]]:
        order = self.order()
        start, self._start = self._start, 0
        self._epoch_start_offset = start
        self._iteration = (order, start)
        for lo in range(start, self.dataset_len, self.global_batch_size):
            indices = self._rank_part(order, lo)
            if indices is None:
                return
            yield indices

    def _rank_part(self, order: np.ndarray, lo: int) -> list[int] | None:
        """This rank's share of the global batch starting at ``order[lo]``; None when drop_last drops it."""
        width, w = self.global_batch_size, self.num_replicas
        chunk = order[lo:lo + width]
        if len(chunk) < width:
            if self.drop_last:
                return None
            if w > 1:  # every rank needs a batch of the same size: pad from the start of the order
                per_rank = -(-len(chunk) // w)  # (cyclically: a dataset smaller than the world is repeated)
                chunk = np.concatenate([chunk, np.resize(order, per_rank * w - len(chunk))])
        per_rank = len(chunk) // w
        return chunk[self.rank * per_rank:(self.rank + 1) * per_rank].tolist()

    def batch_indices(self, batches_since_start: int) -> list[int] | None:
        """The dataset indices of batch ``batches_since_start`` of the running iteration (None before one).

        Computed from the iteration's order, not remembered from what was yielded, so it is
        right even when a dataloader's workers have already fetched batches ahead.

        Args:
            batches_since_start: the batch's index in the running iteration.

        Returns:
            This rank's dataset indices of that batch, or None before any iteration or past its end.
        """
        iteration = getattr(self, "_iteration", None)
        if iteration is None:
            return None
        order, start = iteration
        lo = start + batches_since_start * self.global_batch_size
        return self._rank_part(order, lo) if lo < self.dataset_len else None

    def __len__(self) -> int:
        """Batches per rank in a whole epoch (a resumed epoch yields fewer)."""
        full, rest = divmod(self.dataset_len, self.global_batch_size)
        return full if self.drop_last or not rest else full + 1

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps of this sampler.

        Returns:
            Its seed and the data layout :meth:`load_state_dict` checks, as plain data.
        """
        return {"seed": self.seed, "shuffle": self.shuffle, "batch_size": self.batch_size,
                "drop_last": self.drop_last, "dataset_len": self.dataset_len}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take the saved seed; the data layout must be the one the checkpoint was taken with.

        Args:
            state: what :meth:`state_dict` returned.

        Raises:
            ConfigurationError: the shuffle, batch size, drop_last or dataset length differ.
        """
        for key in ("shuffle", "batch_size", "drop_last", "dataset_len"):
            if state.get(key) != getattr(self, key):
                raise ConfigurationError(
                    f"the checkpoint's sampler had {key}={state.get(key)!r} but this dataloader has "
                    f"{key}={getattr(self, key)!r}; resume with the same dataset and batch settings."
                )
        self.seed = int(state["seed"])


class UnrepeatedBatchSampler:
    """Evaluation sampler: rank ``r`` of ``W`` reads its own contiguous shard, in order, once.

    Shards differ in size by at most one sample, so every sample is evaluated exactly
    once across ranks (no padding, no duplicates); ranks may yield different numbers of
    batches, which is fine because metrics synchronise once, after the loop.
    """

    def __init__(self, dataset_len: int, batch_size: int, *, num_replicas: int, rank: int) -> None:
        _check_layout("UnrepeatedBatchSampler", dataset_len, batch_size, num_replicas, rank)
        self.dataset_len = dataset_len
        self.batch_size = batch_size
        self.num_replicas = num_replicas
        self.rank = rank
        base, extra = divmod(dataset_len, num_replicas)
        self.lo = rank * base + min(rank, extra)
        self.hi = self.lo + base + (1 if rank < extra else 0)

    def __iter__(self) -> Iterator[list[int]]:
        for i in range(self.lo, self.hi, self.batch_size):
            yield list(range(i, min(i + self.batch_size, self.hi)))

    def __len__(self) -> int:
        return -(-(self.hi - self.lo) // self.batch_size)


def find_reproducible_sampler(dataloader: Any) -> ReproducibleBatchSampler | None:
    """The reproducible sampler a driver installed in ``dataloader``, if any."""
    for attr in ("batch_sampler", "sampler"):
        candidate = getattr(dataloader, attr, None)
        if isinstance(candidate, ReproducibleBatchSampler):
            return candidate
    return None
