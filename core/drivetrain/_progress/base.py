"""What every progress bar shares: the loss reference, refresh cadence and formatting.

The per-batch cost is one reference store (``on_before_backward``) and one
integer compare (``on_train_batch_end``); the loss is converted to a float only
when the display refreshes, so a bar never forces a device sync per batch.
"""

from __future__ import annotations

import numbers
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from .._callbacks import Callback
from .._common import ConfigurationError, EarlyStopException
from .._data import epoch_of_last_step
from .._mapping import loss_of


class ProgressCallback(Callback):
    """Base class of the progress displays; runs on the global-zero process only.

    Subclasses implement :meth:`refresh` (draw epoch, batch and loss) and may
    override the evaluation and lifecycle hooks; overrides of ``on_train_begin``,
    ``on_train_epoch_begin``/``_end`` and ``on_exception`` call ``super()``, which keeps
    what :meth:`summary` reports (time, epoch, what stopped training).
    """

    rank_zero_only = True

    def __init__(self, print_every: int = 1) -> None:
        if isinstance(print_every, bool) or not isinstance(print_every, int) or print_every < 1:
            raise ConfigurationError(
                f"{type(self).__name__}(print_every={print_every!r}): print_every must be an int >= 1 "
                "(refresh the display every that many batches)."
            )
        self.print_every = print_every
        self._loss: Any = None
        self._shown_batches = -1
        self.last_loss: float | None = None
        self.last_results: dict[str, Any] = {}
        self._start_time: float | None = None
        self._stopped_by: BaseException | None = None  # what ended training, told by on_exception
        self._in_epoch = False

    # ---------------------------------------------------------------- hot path
    changes_loss = False  # on_before_backward only keeps a reference to the loss

    def on_before_backward(self, trainer: Any, outputs: Any) -> None:
        self._loss = loss_of(outputs)

    def on_train_batch_end(self, trainer: Any) -> None:
        done = trainer.batch_idx_in_epoch
        if done % self.print_every == 0 or done == trainer.num_batches_per_epoch:
            self._shown_batches = trainer.global_forward_batches
            self.refresh(trainer, finished_epoch=False)

    # ----------------------------------------------------------- other events
    def on_train_begin(self, trainer: Any) -> None:
        self._start_time = time.perf_counter()
        self._shown_batches = -1
        self._stopped_by, self._in_epoch = None, False

    def on_train_epoch_begin(self, trainer: Any) -> None:
        self._in_epoch = True

    def on_train_epoch_end(self, trainer: Any) -> None:
        self._in_epoch = False
        # The last batches of an epoch whose length is unknown have not been shown yet.
        if self._shown_batches != trainer.global_forward_batches:
            self._shown_batches = trainer.global_forward_batches
            self.refresh(trainer, finished_epoch=True)

    def on_evaluate_end(self, trainer: Any, results: Any) -> None:
        self.last_results = dict(results) if isinstance(results, Mapping) else {"results": results}
        self.show_results(trainer, self.last_results)

    def on_exception(self, trainer: Any, exception: BaseException) -> None:
        # Fired before on_train_end: remembered so the summary says how training ended.
        self._stopped_by = exception

    # ------------------------------------------------------------ subclasses
    def refresh(self, trainer: Any, finished_epoch: bool) -> None:
        """Redraw epoch, batch and loss.

        Args:
            trainer: the `Trainer`, whose counters say where training is.
            finished_epoch: True at ``on_train_epoch_end``, when the epoch's last batch is done.
        """
        raise NotImplementedError

    def show_results(self, trainer: Any, results: dict[str, Any]) -> None:
        """Display the results of an evaluation.

        Args:
            trainer: the `Trainer` that evaluated.
            results: the results, ``{"acc#acc#dev": 0.93}``.
        """
        raise NotImplementedError

    # --------------------------------------------------------------- helpers
    def current_loss(self, trainer: Any) -> float | None:
        """Convert the stored loss to a float (once per refresh) and remember it."""
        loss = self._loss
        if loss is None:
            return self.last_loss
        self._loss = None
        if isinstance(loss, numbers.Real):
            self.last_loss = float(loss)
        else:
            self.last_loss = float(np.mean(trainer.driver.tensor_to_numpy(loss)))
        return self.last_loss

    def elapsed(self) -> float:
        return 0.0 if self._start_time is None else time.perf_counter() - self._start_time

    def summary(self, trainer: Any) -> str:
        """The closing line: how training ended (finished, stopped early, or stopped by an exception),
        the time it took, the last loss and the last evaluation."""
        steps, exc = trainer.global_forward_batches, self._stopped_by
        took = format_seconds(self.elapsed()) if self._start_time is not None else None
        if exc is None:
            parts = [f"training finished: {steps} steps" + (f" in {took}" if took else "")]
        else:
            where = f"at step {steps} (epoch {epoch_of_last_step(trainer, self._in_epoch)})"
            if isinstance(exc, EarlyStopException):
                parts = [f"training stopped early {where}" + (f": {first_line(exc)}" if first_line(exc) else "")]
            else:
                parts = [f"training stopped {where} by {type(exc).__name__}"
                         + (f": {first_line(exc)}" if first_line(exc) else "")]
            if took:
                parts.append(f"after {took}")
        loss = self.current_loss(trainer)
        if loss is not None:
            parts.append(f"last loss {format_value(loss)}")
        if self.last_results:
            parts.append(f"last evaluation {format_results(self.last_results)}")
        return "; ".join(parts)


_NO_EPOCH_LIMIT = 10**9


def total_epochs(trainer: Any) -> int | None:
    """``trainer.n_epochs``, or None when training is bounded by batches only (a huge sentinel or None)."""
    n = trainer.n_epochs
    return None if n is None or n >= _NO_EPOCH_LIMIT else n


def epoch_number(trainer: Any, finished_epoch: bool) -> int:
    """1-based number of the epoch on display (``cur_epoch_idx`` moves on before on_train_epoch_end)."""
    return trainer.cur_epoch_idx if finished_epoch else trainer.cur_epoch_idx + 1


def of_total(done: int, total: int | None) -> str:
    return f"{done}/{total}" if total else str(done)


def format_value(value: Any) -> str:
    """Floats with 4 significant digits; anything else as ``str``."""
    if isinstance(value, (bool, np.bool_)):
        return str(value)
    if isinstance(value, (numbers.Real, np.floating, np.integer)):
        if isinstance(value, (numbers.Integral, np.integer)):
            return str(int(value))
        return f"{float(value):.4g}"
    if isinstance(value, np.ndarray) and value.size == 1:
        return format_value(value.item())
    return str(value)


def format_results(results: Mapping[str, Any]) -> str:
    """``{"acc#acc#dev": 0.93127}`` -> ``"acc#acc#dev=0.9313"``."""
    return ", ".join(f"{key}={format_value(value)}" for key, value in results.items())


def format_seconds(seconds: float) -> str:
    """``12.4 s`` under a minute (a short run must not read ``0:00``), else ``m:ss`` or ``h:mm:ss``."""
    if round(seconds, 1) < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def first_line(exception: BaseException) -> str:
    """The exception's message on one line (a summary line must stay one line); ``""`` when it has none."""
    lines = str(exception).strip().splitlines()
    return lines[0] + (" ..." if len(lines) > 1 else "") if lines else ""
