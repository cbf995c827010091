"""How long a run is, counted from where it starts: the one rule for fresh and resumed runs.

A checkpoint's position is an epoch, the samples of that epoch already consumed, and the
steps taken in all. Samples do not depend on the world size; steps do (a step is one
global batch, ``batch_size x world size`` samples). So a run resumed at another world size
re-derives its position in its own layout -- the batch of the epoch it starts at -- and
plans its length from there:

- ``n_epochs`` bounds epochs: the run ends when epoch ``n_epochs`` is complete, however
  many steps the earlier epochs took at their world size;
- ``n_batches`` (when the user gave it) bounds steps: the run ends at that global step.

Either way every sample of the resumed epoch that was not consumed is trained on once,
and every later epoch whole.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from .._common import logger


@dataclasses.dataclass(frozen=True)
class Position:
    """Where the loop stands, as a checkpoint stores it: ``batches_done`` batches of epoch ``epoch`` are behind
    it, ``global_forward_batches`` steps in all; ``consumed_samples`` of the epoch (None without a reproducible
    sampler) is what a resume at another world size re-derives its batch from."""

    epoch: int
    batches_done: int
    global_forward_batches: int
    consumed_samples: int | None

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> Position:
        """The position a checkpoint's ``training_state.json`` holds."""
        consumed = state.get("consumed_samples")
        return cls(int(state["epoch"]), int(state["batches_done"]), int(state["global_forward_batches"]),
                   None if consumed is None else int(consumed))


@dataclasses.dataclass(frozen=True)
class LoopLength:
    """The run's end: ``n_epochs`` (None: unknown, an iterable without length) and the global step
    ``n_batches`` it ends at (None: unknown)."""

    n_epochs: int | None
    n_batches: int | None

    def reached_by(self, position: Position) -> bool:
        """Whether a run at ``position`` has nothing left to train."""
        epochs_done = self.n_epochs is not None and position.epoch >= self.n_epochs
        return epochs_done or (self.n_batches is not None and position.global_forward_batches >= self.n_batches)


def plan_length(*, requested_epochs: int, requested_batches: int, per_epoch: int | None, epoch: int = 0,
                steps: int = 0, start_batch: int = 0) -> LoopLength:
    """The run's end given what was asked (``requested_batches == -1``: only ``requested_epochs``),
    the batches per epoch in this run's layout, and where it starts.

    ``epoch``/``steps``/``start_batch``: the epoch it starts in, the steps taken before (by any
    world size) and the batch of that epoch it starts at in this layout (0 for a fresh run).
    ``steps - start_batch`` steps are then counted as taken before the epoch began.
    """
    before = steps - start_batch
    if requested_batches == -1:
        if per_epoch is None:
            return LoopLength(requested_epochs, None)
        return LoopLength(requested_epochs, max(steps, before + (requested_epochs - epoch) * per_epoch))
    if per_epoch:
        return LoopLength(max(epoch, epoch + -(-(requested_batches - before) // per_epoch)), requested_batches)
    return LoopLength(None, requested_batches)  # an iterable without len: epochs end when n_batches is reached


@dataclasses.dataclass(frozen=True)
class ResumedFrom:
    """What a resumed run knows of the checkpoint it started from (its position and how its run ended)."""

    folder: str
    epoch: int
    batches_done: int
    steps: int
    ended: str | None  # "finished", "early_stopped", or None: the run was still going when it saved

    @classmethod
    def from_manifest(cls, folder: str, trainer_fields: dict[str, Any]) -> ResumedFrom:
        return cls(folder, int(trainer_fields.get("epoch", 0)), int(trainer_fields.get("batches_done", 0)),
                   int(trainer_fields.get("global_forward_batches", 0)), trainer_fields.get("ended"))

    def where(self) -> str:
        if self.batches_done:
            return f"epoch {self.epoch + 1} after {self.batches_done} of its batches (step {self.steps})"
        return f"the end of epoch {self.epoch} (step {self.steps})"

    def has_work(self, length: LoopLength, start: Position, *, by_steps: bool, per_epoch: int | None,
                 latest: bool) -> bool:
        """Whether a run planned from this checkpoint to ``length`` trains anything; says in one line when it
        does not, and when it trains on after a run that had ended.

        ``start``: the run's position, its ``batches_done`` in this run's layout; ``by_steps``: the user gave
        ``n_batches`` (else ``n_epochs``); ``per_epoch``: batches per epoch in this layout (None: unknown).
        """
        source = f"resume_from='latest' ({self.folder})" if latest else f"resume_from={self.folder!r}"
        if self.ended == "early_stopped" and latest:
            logger.warning(
                "%s: the checkpoint holds a run that stopped early (EarlyStopCallback) at %s: nothing to train, no "
                "checkpoint or run record written. To train on from it anyway pass resume_from=%r.",
                source, self.where(), self.folder)
            return False
        if length.reached_by(start):
            asked = f"n_batches={length.n_batches}" if by_steps else f"n_epochs={length.n_epochs}"
            # an epoch whose batches are all done still counts as open (its end was not reached): one more
            open_epoch = per_epoch is None or start.batches_done < per_epoch
            more = f"n_batches={self.steps + 1}" if by_steps else f"n_epochs={self.epoch + (1 if open_epoch else 2)}"
            logger.warning("%s: the checkpoint holds %s and %s asks for no more: nothing to train, no checkpoint "
                           "or run record written. Pass %s or more to train on.", source, self.where(), asked, more)
            return False
        if self.ended is not None:
            how = "finished" if self.ended == "finished" else "stopped early"
            logger.info("%s: continuing a run that %s at %s, to %s.", source, how, self.where(),
                        f"step {length.n_batches}" if by_steps else f"epoch {length.n_epochs}")
        return True


def epoch_of_last_step(trainer: Any, in_epoch: bool) -> int:
    """The 1-based epoch the last step belongs to: the running one (``in_epoch``), or the one just
    completed. What the summary line and ``summary.json`` name."""
    return trainer.cur_epoch_idx + 1 if in_epoch else max(trainer.cur_epoch_idx, 1)
