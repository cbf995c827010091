"""WarmupSchedule: the fine-tuning learning-rate schedules, written once for every framework.

A schedule is a pure function of the number of optimizer steps taken
(:func:`schedule_factor`); the callback multiplies the optimizer's base rates by it
and hands the result to the driver (``Driver.set_lrs``), so the same schedule drives
a torch, paddle, jittor, oneflow or third-party optimizer. Its state is two numbers
and the base rates, stored in checkpoints like any callback's.
"""

from __future__ import annotations

import math
import numbers
import warnings
from typing import Any

from .._common import ConfigurationError, close_matches
from .._data import AccumulationCycle
from .base import Callback
from .lr_scheduler import LRSchedulerCallback

KINDS = ("linear", "cosine", "constant")
_OWNER = "WarmupSchedule"
# Names Hugging Face's lr_scheduler_type uses for the same shapes.
_HF_NAMES = {
    "constant_with_warmup": "kind='constant'",
    "cosine_with_min_lr": "kind='cosine' with min_lr_ratio=",
    "cosine_with_restarts": "kind='cosine' (restarts are not offered)",
    "linear_with_warmup": "kind='linear'",
}


def schedule_factor(kind: str, step: int, warmup_steps: int, total_steps: int | None,
                    min_lr_ratio: float = 0.0) -> float:
    """The multiple of the base rate used by the optimizer step that follows ``step`` completed steps.

    Warmup: step ``t`` (counted from 1) of the first ``warmup_steps`` uses ``t / warmup_steps``,
    so the first step already learns and step ``warmup_steps`` uses the full rate. Then
    ``"constant"`` stays at 1, and ``"linear"`` / ``"cosine"`` decay from 1 to
    ``min_lr_ratio`` over the remaining ``total_steps - warmup_steps`` steps, reaching it
    after the last step (``step == total_steps``) and staying there if training goes on.
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if kind == "constant":
        return 1.0
    if total_steps is None:
        raise ValueError(f"schedule_factor: kind={kind!r} decays over total_steps, which is None.")
    decay_steps = total_steps - warmup_steps
    progress = 1.0 if decay_steps <= 0 else min(1.0, (step - warmup_steps) / decay_steps)
    shape = 1.0 - progress if kind == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
    return min_lr_ratio + (1.0 - min_lr_ratio) * shape


def _is_real(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, numbers.Real) and math.isfinite(value)


class WarmupSchedule(Callback):
    """Warm the learning rate up, then keep it (``"constant"``) or decay it (``"linear"``, ``"cosine"``).

    The base rates are the optimizers' own (every param group of every optimizer, read
    through the driver when the Trainer is built); each step uses ``base * factor`` with
    the factor of :func:`schedule_factor`. The rate is set before the first optimizer
    step and after every real one, so with ``accumulation_steps=k`` the schedule advances
    once per k batches. ``warmup_steps`` counts optimizer steps; ``warmup_ratio`` is a
    fraction of ``total_steps`` (rounded up). ``total_steps`` defaults to the optimizer
    steps of the run, worked out from the Trainer's ``n_epochs``/``n_batches`` and
    ``accumulation_steps``. Checkpoints carry the base rates and the step count, so a
    resumed run continues the schedule exactly.

    Hugging Face's ``lr_scheduler_type="linear" | "cosine" | "constant_with_warmup"``,
    ``warmup_steps``, ``warmup_ratio`` and ``min_lr_rate`` map to ``kind``,
    ``warmup_steps``, ``warmup_ratio`` and ``min_lr_ratio``.

    Args:
        kind: ``"linear"`` or ``"cosine"`` decay to ``min_lr_ratio`` after the warmup, or ``"constant"``.
        warmup_steps: optimizer steps of linear warmup from 0 (give this or ``warmup_ratio``).
        warmup_ratio: the warmup as a fraction of ``total_steps``.
        total_steps: optimizer steps of the whole schedule (default: the run's).
        min_lr_ratio: the fraction of the base rate the decay ends at.

    Raises:
        ConfigurationError: an unknown ``kind``, both ``warmup_steps`` and ``warmup_ratio``, or a value out
            of range.
    """

    def __init__(self, kind: str = "linear", *, warmup_steps: int | None = None, warmup_ratio: float | None = None,
                 total_steps: int | None = None, min_lr_ratio: float = 0.0) -> None:
        _check_kind(kind)
        if warmup_steps is not None and warmup_ratio is not None:
            raise ConfigurationError(
                f"{_OWNER}(warmup_steps={warmup_steps!r}, warmup_ratio={warmup_ratio!r}): give one of them, not "
                "both; warmup_steps counts optimizer steps, warmup_ratio is a fraction of all of them."
            )
        if warmup_steps is not None and (isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int)
                                         or warmup_steps < 0):
            raise ConfigurationError(
                f"{_OWNER}(warmup_steps={warmup_steps!r}) is not accepted; pass an int >= 0 (optimizer steps), or "
                "warmup_ratio= for a fraction of the run."
            )
        if warmup_ratio is not None and (not _is_real(warmup_ratio) or not 0 <= warmup_ratio <= 1):
            raise ConfigurationError(
                f"{_OWNER}(warmup_ratio={warmup_ratio!r}) is not accepted; pass a number from 0 to 1 (0.1 warms up "
                "over the first 10% of the optimizer steps), or warmup_steps= for a number of steps."
            )
        if total_steps is not None and (isinstance(total_steps, bool) or not isinstance(total_steps, int)
                                        or total_steps < 1):
            raise ConfigurationError(
                f"{_OWNER}(total_steps={total_steps!r}) is not accepted; pass an int >= 1 (optimizer steps), or "
                "None to take the number of optimizer steps of the run."
            )
        if not _is_real(min_lr_ratio) or not 0 <= min_lr_ratio <= 1:
            raise ConfigurationError(
                f"{_OWNER}(min_lr_ratio={min_lr_ratio!r}) is not accepted; pass a number from 0 to 1, the fraction "
                "of the base rate the decay ends at (0 decays to zero)."
            )
        if kind == "constant" and min_lr_ratio != 0:
            raise ConfigurationError(
                f"{_OWNER}(kind='constant', min_lr_ratio={min_lr_ratio!r}): a constant schedule does not decay; "
                "drop min_lr_ratio or use kind='linear' or 'cosine'."
            )
        if warmup_steps is not None and total_steps is not None and warmup_steps > total_steps:
            raise ConfigurationError(
                f"{_OWNER}(warmup_steps={warmup_steps}, total_steps={total_steps}): the warmup is longer than the "
                "whole schedule; pass warmup_steps <= total_steps."
            )
        self.kind = kind
        self.warmup_steps = warmup_steps
        self.warmup_ratio = warmup_ratio
        self.total_steps = total_steps
        self.min_lr_ratio = float(min_lr_ratio)
        self.base_lrs: list[list[float]] | None = None
        """The optimizers' rates before scheduling, per optimizer and param group."""
        self.steps = 0
        """Optimizer steps taken so far (restored from a checkpoint on resume)."""
        self._total: int | None = None  # the run's optimizer steps, known once training begins
        self._saved_total: int | None = None

    def __repr__(self) -> str:
        warmup = (f"warmup_ratio={self.warmup_ratio!r}" if self.warmup_ratio is not None
                  else f"warmup_steps={self.warmup_steps or 0}")
        return (f"{_OWNER}({self.kind!r}, {warmup}, total_steps={self.total_steps!r}, "
                f"min_lr_ratio={self.min_lr_ratio!r})")

    # ------------------------------------------------------------------ the shape
    def factor(self, step: int, total_steps: int | None = None) -> float:
        """The multiple of the base rate for the step after ``step`` completed ones (see :func:`schedule_factor`).

        Args:
            step: optimizer steps completed.
            total_steps: the schedule's length (default: the callback's own, else the run's once training began).

        Returns:
            The factor, between 0 and 1.

        Raises:
            ConfigurationError: the schedule needs a length and none is known yet.
        """
        total = next((t for t in (total_steps, self.total_steps, self._total) if t is not None), None)
        if total is None and self._needs_total():
            raise ConfigurationError(
                f"{self!r}.factor({step}) needs the number of optimizer steps; pass total_steps= (the Trainer "
                "works it out when training begins)."
            )
        return schedule_factor(self.kind, step, self._warmup_for(total), total, self.min_lr_ratio)

    def _needs_total(self) -> bool:
        return self.kind != "constant" or self.warmup_ratio is not None

    def _warmup_for(self, total: int | None) -> int:
        if self.warmup_ratio is not None:
            assert total is not None, "callers resolve the total first when warmup_ratio is set"
            return math.ceil(round(self.warmup_ratio * total, 9))  # 0.1 * 30 is 3.0000000000000004, not 4 steps
        return self.warmup_steps or 0

    def current_lrs(self) -> list[list[float]]:
        """The rates the next optimizer step uses: every base rate times :meth:`factor` of :attr:`steps`.

        Returns:
            One list of rates per optimizer, one rate per param group.

        Raises:
            ConfigurationError: the callback was not given to a Trainer yet.
        """
        if self.base_lrs is None:
            raise ConfigurationError(f"{_OWNER}: no base learning rates yet; pass the callback to a Trainer first.")
        factor = self.factor(self.steps)
        return [[base * factor for base in rates] for rates in self.base_lrs]

    # ------------------------------------------------------------------- events
    def on_after_trainer_initialized(self, trainer: Any, driver: Any) -> None:
        _refuse_rivals(self, trainer)
        base = driver.get_lrs()
        driver.set_lrs(base)  # unchanged: refuses now, not at the first step, an optimizer whose rate cannot be set
        self.base_lrs = [list(map(float, rates)) for rates in base]

    def on_train_begin(self, trainer: Any) -> None:
        total = self.total_steps
        if total is None and self._needs_total():
            total = AccumulationCycle(trainer.accumulation_steps).optimizer_steps(
                trainer.n_batches, trainer.num_batches_per_epoch)
            if total is None:
                raise ConfigurationError(
                    f"{_OWNER}(kind={self.kind!r}): the number of optimizer steps of this run is unknown (the "
                    "train dataloader has no len() and the Trainer has no n_batches); pass total_steps= to "
                    f"{_OWNER} or n_batches= to the Trainer."
                )
        if self._saved_total is not None and total is not None and total != self._saved_total:
            warnings.warn(
                f"{_OWNER}: the checkpoint's schedule spans {self._saved_total} optimizer steps but this run has "
                f"{total}; the schedule continues at step {self.steps} of {total}. Resume with the same n_epochs, "
                "n_batches, accumulation_steps and data, or fix total_steps=, to continue it unchanged.",
                RuntimeWarning, stacklevel=2,
            )
        warmup = self._warmup_for(total)
        if total is not None and warmup > total:
            raise ConfigurationError(
                f"{_OWNER}(warmup_steps={warmup}): the warmup is longer than the {total} optimizer steps of this "
                "run; pass fewer warmup_steps, warmup_ratio= for a fraction of the run, or total_steps= if the "
                "schedule is meant to span more than this run."
            )
        self._total = total
        trainer.driver.set_lrs(self.current_lrs())

    def on_after_optimizers_step(self, trainer: Any, optimizers: Any) -> None:
        self.steps += 1
        trainer.driver.set_lrs(self.current_lrs())

    def on_save_checkpoint(self, trainer: Any) -> Any:
        return {"kind": self.kind, "steps": self.steps, "base_lrs": self.base_lrs,
                "total_steps": self._total if self._total is not None else self.total_steps}

    def on_load_checkpoint(self, trainer: Any, states: Any) -> None:
        if states is None:
            return
        if not isinstance(states, dict) or not {"steps", "base_lrs"} <= set(states):
            raise ConfigurationError(
                f"{_OWNER}: the checkpoint's state for this callback is {states!r:.100}, not what {_OWNER} saves; "
                "was it saved by another callback with the same callback_name?"
            )
        base = states["base_lrs"]
        if self.base_lrs is not None and base is not None and [len(r) for r in base] != [len(r) for r in self.base_lrs]:
            raise ConfigurationError(
                f"{_OWNER}: the checkpoint schedules param groups {[len(r) for r in base]} (per optimizer) but this "
                f"Trainer's optimizers have {[len(r) for r in self.base_lrs]}; resume with the same optimizers and "
                "param groups."
            )
        if states.get("kind", self.kind) != self.kind:
            warnings.warn(
                f"{_OWNER}: the checkpoint was written by a {states['kind']!r} schedule, this one is {self.kind!r}; "
                f"the {self.kind!r} shape continues from step {states['steps']}.",
                RuntimeWarning, stacklevel=2,
            )
        if base is not None:
            self.base_lrs = [list(map(float, rates)) for rates in base]
        self.steps = int(states["steps"])
        self._saved_total = states.get("total_steps")


def _refuse_rivals(schedule: WarmupSchedule, trainer: Any) -> None:
    """Refuse a second learning-rate schedule on the same trainer: each would overwrite the other's rates
    after every optimizer step, and the run would follow whichever came last in ``callbacks=``."""
    for other in trainer.callback_manager.callbacks:
        if other is schedule:
            continue
        if isinstance(other, LRSchedulerCallback):
            raise ConfigurationError(
                f"{schedule!r} and LRSchedulerCallback({type(other.scheduler).__name__}) both set the learning rates "
                "of this Trainer's optimizers after every step; keep one: drop the LRSchedulerCallback "
                f"({_OWNER} warms up and decays by itself), or drop the {_OWNER} and build the warmup into your "
                "scheduler (torch: lr_scheduler.SequentialLR of a LinearLR warmup and your decay; paddle: "
                "paddle.optimizer.lr.LinearWarmup around it)."
            )
        if isinstance(other, WarmupSchedule):
            raise ConfigurationError(
                f"{schedule!r} and {other!r} both set the learning rates of this Trainer's optimizers; pass one "
                f"{_OWNER} (it schedules every optimizer and param group)."
            )


def _check_kind(kind: Any) -> None:
    if isinstance(kind, str) and kind in KINDS:
        return
    accepted = ", ".join(repr(k) for k in KINDS)
    message = f"{_OWNER}(kind={kind!r}) is not accepted; pass one of {accepted}."
    if isinstance(kind, str):
        close = close_matches(kind.lower(), KINDS)
        if kind in _HF_NAMES:
            message = (f"{_OWNER}(kind={kind!r}) is not accepted; Hugging Face's {kind!r} is {_HF_NAMES[kind]} "
                       f"here. Pass one of {accepted}.")
        elif close:
            message = f"{_OWNER}(kind={kind!r}) is not accepted; did you mean {close[0]!r}? Pass one of {accepted}."
    raise ConfigurationError(message)
