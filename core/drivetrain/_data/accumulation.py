"""Gradient accumulation: which batches share an optimizer step, and how many steps a run takes.

The one place that knows the rule: with ``accumulation_steps=k`` the optimizer steps after every k-th batch
of an epoch and after the epoch's last batch, so an epoch of ``b`` batches ends with a shorter cycle when
``k`` does not divide ``b``; each batch's loss is divided by the size of its cycle, so a cycle's gradients
are the mean over its batches. A rule that varies ``k`` (per epoch, say) changes this class and nothing else.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class AccumulationCycle:
    """``k`` batches per optimizer step (1: every batch steps)."""

    k: int

    def closes(self, batch_idx: int, epoch_length: int | None) -> bool:
        """Whether batch ``batch_idx`` (0-based in its epoch) ends its cycle: the optimizer steps after it."""
        k = self.k
        if k == 1:
            return True
        done = batch_idx + 1
        return done % k == 0 or (epoch_length is not None and done == epoch_length)

    def size(self, batch_idx: int, epoch_length: int | None) -> int:
        """The number of batches in the cycle of batch ``batch_idx`` (shorter for an epoch's last cycle)."""
        k = self.k
        if epoch_length is None:
            return k
        start = batch_idx // k * k
        return min(k, epoch_length - start)

    def optimizer_steps(self, n_batches: int | None, batches_per_epoch: int | None) -> int | None:
        """How many times the optimizers step in ``n_batches`` batches, or None if unknown.

        Each epoch closes its last cycle, short or not, so an epoch of ``b`` batches takes ``ceil(b / k)``
        steps. Without an epoch length the count assumes no epoch ends inside a cycle.
        """
        if n_batches is None:
            return None
        k = self.k
        if not batches_per_epoch:
            return -(-n_batches // k)
        full, rest = divmod(n_batches, batches_per_epoch)
        return full * -(-batches_per_epoch // k) + -(-rest // k)
