"""Resumable jittor learning-rate schedulers.

``jittor.lr_scheduler`` classes (StepLR, MultiStepLR, CosineAnnealingLR,
ExponentialLR, ReduceLROnPlateau) step the optimizer's learning rate but have no
``state_dict``, so :class:`~drivetrain.LRSchedulerCallback` cannot put them in a
checkpoint. :class:`ResumableScheduler` wraps one: ``step`` is the scheduler's, and
its state is its plain attributes (counters, milestones, base rates -- everything but
the optimizer, whose learning rate travels with the optimizer's own state)::

    scheduler = ResumableScheduler(jt.lr_scheduler.StepLR(optimizer, step_size=10))
    Trainer(..., callbacks=[LRSchedulerCallback(scheduler, step_on="epoch")])
"""

from __future__ import annotations

import math
from typing import Any

from drivetrain import ConfigurationError

from .state import plain_value


def _encode(value: Any) -> Any:
    """inf (ReduceLROnPlateau's initial best) is not JSON: stored as a string."""
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return value


def _decode(value: Any, current: Any) -> Any:
    if value in ("inf", "-inf") and isinstance(current, float):
        return float(value)
    if isinstance(current, tuple) and isinstance(value, list):
        return tuple(value)
    return value


class ResumableScheduler:
    """A jittor LR scheduler with ``state_dict``/``load_state_dict``, for checkpoints."""

    def __init__(self, scheduler: Any) -> None:
        if not callable(getattr(scheduler, "step", None)):
            raise ConfigurationError(
                f"ResumableScheduler(scheduler={scheduler!r:.80}) has no step(); pass a jittor.lr_scheduler object "
                "such as jt.lr_scheduler.StepLR(optimizer, step_size=10)."
            )
        self.scheduler = scheduler

    def step(self, *args: Any, **kwargs: Any) -> Any:
        return self.scheduler.step(*args, **kwargs)

    def state_dict(self) -> dict[str, Any]:
        return {key: _encode(value) for key, value in vars(self.scheduler).items()
                if key != "optimizer" and not key.startswith("_") and plain_value(value)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict):
            raise ConfigurationError(
                f"ResumableScheduler.load_state_dict(state={type(state).__name__}) needs the dict state_dict() returns."
            )
        unknown = sorted(set(state) - set(vars(self.scheduler)))
        if unknown:
            raise ConfigurationError(
                f"the checkpoint's scheduler state has {unknown}, which {type(self.scheduler).__name__} does not; "
                "resume with the same scheduler class as the run that saved it."
            )
        for key, value in state.items():
            setattr(self.scheduler, key, _decode(value, getattr(self.scheduler, key)))
