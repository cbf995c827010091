"""EarlyStopCallback: end training when the monitored value stops improving."""

from __future__ import annotations

import math
from typing import Any

from .._common import ConfigurationError, EarlyStopException
from .args import check_monitor_arg, is_better, resolve_monitor
from .base import Callback

_OWNER = "EarlyStopCallback"


class EarlyStopCallback(Callback):
    """Raise :class:`~drivetrain.EarlyStopException` after ``patience`` evaluations without improvement.

    An evaluation improves when its monitored value beats the best so far by more
    than ``min_delta`` (upwards when ``larger_better``); only then does the best
    move. ``monitor``/``larger_better`` default to the Trainer's. The Trainer ends
    cleanly (``on_train_end`` runs, CheckpointCallback still writes ``last``). The
    best value and the count of evaluations without improvement travel in checkpoints.
    Only evaluations during ``run()`` count: ``trainer.evaluate()`` before or after
    training neither moves the best nor stops anything.

    Args:
        monitor: the result to watch (default: the Trainer's ``monitor``).
        larger_better: whether a larger value is better (default: the Trainer's).
        patience: evaluations without improvement before training stops.
        min_delta: how much a value must beat the best by to count as an improvement.

    Raises:
        ConfigurationError: ``patience`` below 1, a negative or infinite ``min_delta``, or a bad ``monitor``.
    """

    def __init__(self, monitor: Any = None, larger_better: bool | None = None, patience: int = 3,
                 min_delta: float = 0.0) -> None:
        check_monitor_arg(_OWNER, monitor, larger_better)
        if not isinstance(patience, int) or isinstance(patience, bool) or patience < 1:
            raise ConfigurationError(
                f"{_OWNER}(patience={patience!r}) is not accepted; pass an int >= 1 (the number of "
                "evaluations without improvement before stopping)."
            )
        if (not isinstance(min_delta, (int, float)) or isinstance(min_delta, bool) or not math.isfinite(min_delta)
                or min_delta < 0):
            raise ConfigurationError(
                f"{_OWNER}(min_delta={min_delta!r}) is not accepted; pass a finite number >= 0 (how much a "
                "value must beat the best by to count as an improvement)."
            )
        self.monitor = monitor
        self.larger_better = larger_better
        self.patience = patience
        self.min_delta = float(min_delta)
        self.best: float | None = None
        self.wait = 0  # evaluations since the last improvement
        self._monitor: Any = None
        self._larger_better = True
        self._training = False

    def on_train_begin(self, trainer: Any) -> None:
        self._training = True

    def on_train_end(self, trainer: Any) -> None:
        self._training = False

    def on_after_trainer_initialized(self, trainer: Any, driver: Any) -> None:
        self._monitor, self._larger_better = resolve_monitor(
            _OWNER, "early stopping", self.monitor, self.larger_better, trainer)

    def on_evaluate_end(self, trainer: Any, results: Any) -> None:
        if not self._training:  # a standalone trainer.evaluate(): nothing to stop
            return
        value = trainer.monitor_value(results, self._monitor)
        if is_better(value, self.best, self._larger_better, self.min_delta):
            self.best, self.wait = value, 0
            return
        self.wait += 1
        if self.wait >= self.patience:
            # no closing full stop: the summary line goes on after this message with "; "
            raise EarlyStopException(
                f"{_OWNER}: no improvement of the monitored value by more than {self.min_delta:g} in "
                f"{self.wait} evaluation(s) (best {self.best:.4g}, last {value:.4g}) at step "
                f"{trainer.global_forward_batches}"
            )

    def on_save_checkpoint(self, trainer: Any) -> dict[str, Any]:
        return {"best": self.best, "wait": self.wait}

    def on_load_checkpoint(self, trainer: Any, states: Any) -> None:
        if isinstance(states, dict):
            best = states.get("best")
            self.best = None if best is None else float(best)
            self.wait = int(states.get("wait", 0))
