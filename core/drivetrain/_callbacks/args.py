"""Argument checks and monitor handling shared by the built-in callbacks.

Every check raises :class:`~drivetrain.ConfigurationError` naming the callback,
the argument, the value given and what is accepted, at construction time.
"""

from __future__ import annotations

import math
from typing import Any

from .._common import ConfigurationError
from .monitor import validate_monitor


def check_optional_int(owner: str, name: str, value: Any, *, minimum: int, none_means: str) -> None:
    """``value`` is None or an int (not bool) >= ``minimum``."""
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= minimum):
        return
    raise ConfigurationError(
        f"{owner}({name}={value!r}) is not accepted; pass an int >= {minimum}, or None for {none_means}."
    )


def check_bool(owner: str, name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ConfigurationError(f"{owner}({name}={value!r}) is not accepted; pass True or False.")


def check_monitor_arg(owner: str, monitor: Any, larger_better: Any) -> None:
    """``monitor`` is None (the trainer's), a result name or a function; ``larger_better`` None or a bool."""
    if monitor is not None and not isinstance(monitor, str) and not callable(monitor):
        raise ConfigurationError(
            f"{owner}(monitor={monitor!r}) is not accepted; pass a result name such as 'acc', a "
            "function(results) -> float, or None to use the Trainer's monitor."
        )
    if larger_better is not None and not isinstance(larger_better, bool):
        raise ConfigurationError(
            f"{owner}(larger_better={larger_better!r}) is not accepted; pass True, False, or None to use "
            "the Trainer's larger_better."
        )


def resolve_monitor(owner: str, why: str, monitor: Any, larger_better: bool | None, trainer: Any) -> tuple[Any, bool]:
    """The monitor and direction to use once the trainer exists; fails if nothing can be monitored.

    ``why`` says which setting needs a monitor, so the message can name it.
    """
    if getattr(trainer, "evaluator", None) is None:
        raise ConfigurationError(
            f"{owner}: {why} needs evaluation results, but the Trainer has no metrics/evaluate_dataloaders; "
            "pass metrics= and evaluate_dataloaders= to the Trainer."
        )
    chosen = monitor if monitor is not None else trainer.monitor
    if chosen is None:
        raise ConfigurationError(
            f"{owner}: {why} needs a monitor, but monitor=None here and the Trainer has none either; pass "
            f"monitor='<result name>' to {owner} (or to the Trainer)."
        )
    if monitor is not None:
        validate_monitor(monitor, trainer.metrics, list(trainer.evaluator.dataloaders))
    return chosen, trainer.larger_better if larger_better is None else larger_better


def is_better(value: float, reference: float | None, larger_better: bool, min_delta: float = 0.0) -> bool:
    """``value`` beats ``reference`` by more than ``min_delta``; NaN never does, anything beats None."""
    if math.isnan(value):
        return False
    if reference is None or math.isnan(reference):
        return True
    return value - reference > min_delta if larger_better else reference - value > min_delta


def monitor_label(monitor: Any) -> str:
    """A short, file-name-safe name for a monitor (a result name, or a function's name)."""
    name = monitor if isinstance(monitor, str) else getattr(monitor, "__name__", "monitor")
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in name).strip("_")
    return safe or "monitor"
