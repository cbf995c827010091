"""The run recorder: the callback that feeds the loggers and ``Trainer.history`` from the loop's events.

Per batch it stores a reference to the loss and to the gradient norm the driver computed while
clipping (``Driver.grad_norm``), and counts samples and tokens (a dict batch's ``num_tokens``,
else the sum of its ``attention_mask``); nothing is read from the device until a window of
``log_every_n_steps`` batches closes. Then, on every rank, the window's sums and counts are
converted once and (in a distributed run) summed over the ranks in one all-reduce, so every
rank holds the same numbers; the global-zero process writes them. After an exception (Ctrl-C,
SIGTERM, an error on some rank) the last window is closed from this process's own numbers, without
that all-reduce: the other ranks may be gone or their process group shut down, and every rank that
failed skips it alike, so none waits for another; ``summary.json`` then says ``stopped`` or ``failed``.
Evaluation results, the configuration and the final summary go to the loggers as they come.

A logger that raises is named in a :class:`~drivetrain.ConfigurationError`-free warning and
dropped for the rest of the run: a broken record never stops training or a checkpoint.
"""

from __future__ import annotations

import datetime
import os
import time
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np

from .._callbacks import Callback
from .._common import EarlyStopException, Preempted, TrainingTerminated
from .._common import logger as log
from .._data import epoch_of_last_step
from .._mapping import loss_of
from .logger import Logger

DEFAULT_EVERY = 50
FLUSH_SECS = 1.0
"""Windows closing faster than this are flushed together: a crash loses at most this much of the record."""


def default_run_dir() -> str:
    """``runs/<date>-<time>`` under the working directory: where string-named loggers write by default."""
    return os.path.join("runs", datetime.datetime.now().strftime("%Y%m%d-%H%M%S"))


class HistoryRecorder(Callback):
    """Keeps ``Trainer.history``: every evaluation's results (no per-batch cost), kept in checkpoints."""

    def __init__(self) -> None:
        self.history: dict[str, list[dict[str, Any]]] = {"train": [], "evaluate": []}

    @property
    def callback_name(self) -> str:
        return "RunRecorder"

    def on_save_checkpoint(self, trainer: Any) -> Any:
        return {"history": self.history}

    def on_load_checkpoint(self, trainer: Any, states: Any) -> None:
        history = states.get("history") if isinstance(states, Mapping) else None
        if isinstance(history, Mapping):
            self.history = {kind: list(history.get(kind, [])) for kind in ("train", "evaluate")}

    def on_evaluate_end(self, trainer: Any, results: Any) -> None:
        if isinstance(results, Mapping):
            scalars = {name: float(value) for name, value in results.items() if _is_number(value)}
            self.history["evaluate"].append({"step": trainer.global_forward_batches, "epoch": trainer.cur_epoch_idx,
                                             **scalars})
            self._evaluated(scalars, trainer.global_forward_batches)

    def _evaluated(self, scalars: dict[str, float], step: int) -> None:
        """What a subclass does with an evaluation's results beside keeping them."""


class RunRecorder(HistoryRecorder):
    """Feeds ``loggers`` every ``every`` batches and keeps ``history`` (see the module docstring)."""

    def __init__(self, loggers: list[Logger], every: int, run_dir: str | None, hparams: Mapping[str, Any]) -> None:
        super().__init__()
        self.loggers = loggers
        self.every = every
        self.run_dir = run_dir
        self._explicit_dir = run_dir is not None
        self.hparams = dict(hparams)
        self._resume_step: int | None = None
        self._status = "finished"
        self._alone = False  # after an exception: no collective any more (see the module docstring)
        self._losses: list[Any] = []
        self._tokens: list[Any] = []
        self._norms: list[Any] = []
        self._samples = 0
        self._window_start = 0.0
        self._window_first = 0
        self._start = 0.0
        self._flushed = 0.0
        self._seconds_before = 0.0  # training time of the run before the checkpoint this one resumed from

    # ---------------------------------------------------------------- checkpoints
    def on_save_checkpoint(self, trainer: Any) -> Any:
        self._flush(time.perf_counter())  # on disk before the checkpoint: a resume keeps every row up to it
        return {"run_dir": self.run_dir, "step": trainer.global_forward_batches, "seconds": self._seconds_total(),
                **super().on_save_checkpoint(trainer)}

    def on_load_checkpoint(self, trainer: Any, states: Any) -> None:
        super().on_load_checkpoint(trainer, states)
        if not isinstance(states, Mapping):
            return
        if not self._explicit_dir and states.get("run_dir"):
            self.run_dir = str(states["run_dir"])  # the resumed run appends to the record it continues
        self._resume_step = int(states.get("step", 0))
        self._seconds_before = float(states.get("seconds", 0.0))

    # ------------------------------------------------------------------ lifecycle
    def on_train_begin(self, trainer: Any) -> None:
        self._start = time.perf_counter()
        self._reset_window(trainer.global_forward_batches)
        if self.run_dir is None:
            self.run_dir = trainer.driver.broadcast_object(default_run_dir()) if trainer.driver.is_distributed() \
                else default_run_dir()
        if not trainer.driver.is_global_zero:
            self.loggers = []
            return
        for logger in list(self.loggers):
            self._call(logger, "open", self.run_dir, self._resume_step)
        if self.loggers:
            where = ", ".join(logger.describe() for logger in self.loggers)
            log.info("recording the run with %s", where)
        self._each("log_hyperparams", {**self.hparams, **_driver_facts(trainer)})

    def on_train_end(self, trainer: Any) -> None:
        if trainer.global_forward_batches > self._window_first and self._losses:
            self._log_window(trainer, together=not self._alone)
        # "epoch" is the one the summary line names (the epoch of the last step, 1-based); "seconds" counts
        # this run() alone, "seconds_total" the whole run across its resumes
        summary = {"step": trainer.global_forward_batches, "epoch": epoch_of_last_step(trainer, trainer.in_epoch),
                   "seconds": round(time.perf_counter() - self._start, 3),
                   "seconds_total": round(self._seconds_total(), 3), **self._last("train"), **self._last("evaluate")}
        if self._resume_step is not None:
            summary["resumed_at_step"] = self._resume_step
        self._each("close", self._status, summary)
        self.loggers = []  # closed: evaluations after run() go to the history only

    def _seconds_total(self) -> float:
        return self._seconds_before + (time.perf_counter() - self._start if self._start else 0.0)

    def on_exception(self, trainer: Any, exception: BaseException) -> None:
        stopped = isinstance(exception, (EarlyStopException, KeyboardInterrupt, TrainingTerminated))
        self._status = "preempted" if isinstance(exception, Preempted) else "stopped" if stopped else "failed"
        self._alone = not isinstance(exception, EarlyStopException)  # an early stop is a normal end on every rank

    # ------------------------------------------------------------------- hot path
    def on_train_batch_begin(self, trainer: Any, batch: Any, indices: Any) -> None:
        self._samples += len(indices) if indices is not None else _leading_size(batch)
        if type(batch) is dict:
            tokens = batch.get("num_tokens", batch.get("attention_mask"))
            if tokens is not None:
                self._tokens.append(tokens)

    changes_loss = False  # on_before_backward only collects the loss

    def on_before_backward(self, trainer: Any, outputs: Any) -> None:
        self._losses.append(loss_of(outputs))

    def on_train_batch_end(self, trainer: Any) -> None:
        driver = trainer.driver
        if driver.grad_norm is not None:  # this batch stepped and clipped by norm
            self._norms.append(driver.grad_norm)
            driver.grad_norm = None
        if trainer.global_forward_batches % self.every == 0:
            self._log_window(trainer)

    def _evaluated(self, scalars: dict[str, float], step: int) -> None:
        self._each("log_evaluation", scalars, step)
        self._flush(time.perf_counter())

    # -------------------------------------------------------------------- windows
    def _log_window(self, trainer: Any, together: bool = True) -> None:
        """Log the window that ends now; ``together``: sum its counts over the ranks first (one all-reduce)."""
        driver = trainer.driver
        losses = [loss for loss in self._losses if loss is not None]
        loss_sum = float(driver.scalars_to_numpy(losses).sum()) if losses else 0.0
        tokens = float(sum(_as_numpy(driver, count).sum() for count in self._tokens))
        norm_sum = float(driver.scalars_to_numpy(self._norms).sum()) if self._norms else 0.0
        seconds = max(time.perf_counter() - self._window_start, 1e-9)
        counts = np.array([loss_sum, len(losses), self._samples, tokens, seconds, norm_sum, len(self._norms)],
                          dtype=np.float64)
        if together and driver.is_distributed():  # one all-reduce: every rank gets the same numbers (the mean window time)
            counts = driver.all_reduce(counts, "sum")
            counts[4] /= driver.world_size
        step = trainer.global_forward_batches
        seconds = float(counts[4])
        scalars: dict[str, float] = {}
        if counts[1]:
            scalars["train/loss"] = float(counts[0] / counts[1])
        scalars.update(_learning_rates(driver))
        if counts[6]:
            scalars["train/grad_norm"] = float(counts[5] / counts[6])
        scalars["train/steps_per_s"] = (step - self._window_first) / seconds
        scalars["train/samples_per_s"] = float(counts[2]) / seconds
        if self._tokens:
            scalars["train/tokens_per_s"] = float(counts[3]) / seconds
        self.history["train"].append({"step": step, "epoch": trainer.cur_epoch_idx, **scalars})
        self._each("log_scalars", scalars, step)
        now = time.perf_counter()
        if now - self._flushed >= FLUSH_SECS:
            self._flush(now)
        self._reset_window(step)

    def _flush(self, now: float) -> None:
        self._flushed = now
        self._each("flush")

    def _reset_window(self, step: int) -> None:
        self._losses, self._tokens, self._norms, self._samples = [], [], [], 0
        self._window_first = step
        self._window_start = time.perf_counter()

    def _last(self, kind: str) -> dict[str, Any]:
        rows = self.history[kind]
        return {k: v for k, v in rows[-1].items() if k not in ("step", "epoch")} if rows else {}

    # -------------------------------------------------------------------- loggers
    def _each(self, method: str, *args: Any) -> None:
        for logger in list(self.loggers):
            self._call(logger, method, *args)

    def _call(self, logger: Logger, method: str, *args: Any) -> None:
        try:
            getattr(logger, method)(*args)
        except Exception as exc:  # a broken record must not end the training it records
            self.loggers.remove(logger)
            warnings.warn(
                f"logger {logger.name!r} ({type(logger).__name__}) raised in {method}(): {type(exc).__name__}: "
                f"{exc}. It is left out for the rest of this run; training and checkpoints go on.",
                RuntimeWarning, stacklevel=2,
            )


def _as_numpy(driver: Any, value: Any) -> np.ndarray:
    if isinstance(value, (int, float, np.ndarray, np.number)):
        return np.asarray(value)
    return driver.tensor_to_numpy(value)


def _learning_rates(driver: Any) -> dict[str, float]:
    """``train/lr`` for one optimizer with one group; ``train/lr_<i>[_<g>]`` otherwise."""
    try:
        lrs = driver.get_lrs()
    except Exception:  # a backend that cannot read learning rates: the record has none
        return {}
    if len(lrs) == 1 and len(lrs[0]) == 1:
        return {"train/lr": float(lrs[0][0])}
    out = {}
    for i, groups in enumerate(lrs):
        for g, lr in enumerate(groups):
            out[f"train/lr_{i}" if len(groups) == 1 else f"train/lr_{i}_{g}"] = float(lr)
    return out


def _driver_facts(trainer: Any) -> dict[str, Any]:
    from .._common import __version__

    driver = trainer.driver
    facts = {"driver": driver.describe(), "world_size": driver.world_size, "precision": driver.precision,
             "drivetrain": __version__}
    if os.environ.get("SLURM_JOB_ID"):  # which job, and how many times Slurm requeued it
        facts.update(slurm_job_id=os.environ["SLURM_JOB_ID"],
                     slurm_restart_count=int(os.environ.get("SLURM_RESTART_COUNT") or 0))
    return facts


def _leading_size(batch: Any) -> int:
    """The batch size: the first dimension of the first array-like value found in the batch."""
    values = batch.values() if isinstance(batch, Mapping) else batch if isinstance(batch, (list, tuple)) else [batch]
    for value in values:
        shape = getattr(value, "shape", None)
        if shape is not None and len(shape):
            return int(shape[0])
    return 0


def _is_number(value: Any) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True
