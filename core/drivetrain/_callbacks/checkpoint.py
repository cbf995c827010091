"""CheckpointCallback: periodic, last, on-exception and top-k checkpoints with rotation.

Every checkpoint is one sub-folder of ``folder``, written atomically (a crash leaves
a ``.tmp-`` folder that readers ignore) and deleted by renaming it to a ``.tmp-``
name first, so the folder never holds a half checkpoint under a real name.
``Trainer.run(resume_from=folder)`` picks the newest complete one.
"""

from __future__ import annotations

import enum
import math
import os
import re
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._checkpoint import HostBuffers
from .._common import ConfigurationError, EarlyStopException, logger
from .._format import CheckpointError, remove_checkpoint
from .args import (
    check_bool,
    check_monitor_arg,
    check_optional_int,
    is_better,
    monitor_label,
    resolve_monitor,
)
from .base import Callback

SAVE_OBJECTS = ("trainer", "model")
LAST = "last"
STEP_DIGITS = 8
# Older names (epoch_{e}-batch_{b}-step_{s}, unpadded) are still recognised, so a run resumed from
# a folder written by an earlier version keeps rotating its periodic checkpoints.
_PERIODIC = re.compile(r"step_\d+-epoch_\d+-batch_\d+|epoch_\d+-batch_\d+-step_\d+")
_TOPK = re.compile(r"topk-[A-Za-z0-9._+-]+-step_\d+")
_OWNER = "CheckpointCallback"


class _Phase(enum.Enum):
    """Where the run stands, as far as saving goes; the events that move it are in ``CheckpointCallback``."""

    IDLE = "outside Trainer.run(): a top-k evaluation is saved at once"
    BETWEEN_EPOCHS = "training, no epoch open: due saves are written at (epoch, 0 batches)"
    IN_EPOCH = "training inside an epoch: due saves are written at (epoch, batches done)"
    FAILED = "training raised (not EarlyStopException): the state may be mid-batch, nothing more is due"


@dataclass
class _Due:
    """Saves a completed step made due, waiting for the point where that step is complete."""

    periodic: bool = False
    best: float | None = None  # the best top-k value evaluated at this step


@dataclass
class _Pending:
    """A background save in flight: what to do once it is committed (``done``: rotation) or has failed
    (``failed``: forget its name), and (distributed) the step of the next shared check whether every rank's
    writer has finished; the gap between checks doubles, so a long write costs a few collectives."""

    save: Any  # a PendingSave
    done: Callable[[], None]
    failed: Callable[[], None]
    check_at: int
    gap: int = 1


@dataclass
class _Timer:
    """``every_n_seconds``: the clock reading the interval counts from, and (distributed) when to check next.

    Distributed, rank 0 decides at shared checks and schedules the next one after about half the time
    left at the pace measured since its previous check. One pace can mislead (a first batch that is
    quicker than the rest would put the next check far past the interval), so the gap between two
    checks at most doubles each time: a wrong estimate costs one more check, never a missed save.
    """

    since: float = 0.0  # when training began or the last periodic save was written
    next_check: int = 0  # distributed: the step of the next shared check (the same on every rank)
    checked_at: tuple[float, int] = (0.0, 0)  # rank 0: (clock, step) of its previous check, for the pace
    gap: int = 1  # rank 0: batches between its previous check and the one before

    def start(self, now: float, step: int) -> None:
        self.since, self.next_check, self.checked_at, self.gap = now, step + 1, (now, step), 1

    def decide(self, now: float, step: int, interval: float) -> tuple[bool, int]:
        """Rank 0: (save now?, batches until the next check), the latter after about half the time left."""
        last_time, last_step = self.checked_at
        self.checked_at = (now, step)
        left = interval - (now - self.since)
        if left <= 0:
            self.gap = 1
            return True, 1  # the save resets ``since``; the next check measures the pace again
        pace = (now - last_time) / max(step - last_step, 1)  # seconds per batch since the previous check
        estimate = max(1, int(left / 2 / pace)) if pace > 0 else 1
        self.gap = min(estimate, 2 * self.gap)
        return False, self.gap


class CheckpointCallback(Callback):
    """Save checkpoints into sub-folders of ``folder`` while training.

    - ``every_n_batches`` / ``every_n_epochs`` / ``every_n_seconds``: periodic ``step_{s}-epoch_{e}-batch_{b}``
      (``s`` batches in all, zero-padded to 8 digits so that names sort in step order;
      ``e`` epochs and ``b`` batches of the next one done); at most ``keep_last_n``
      (Hugging Face's name: ``save_total_limit``) of them are kept, the oldest deleted first.
      ``every_n_seconds`` makes a save due at the end of the first batch that ends ``S`` seconds of
      wall time after training began (or resumed) or after the last periodic save was written;
    - ``save_last``: ``last``, when training ends normally (finished or early-stopped);
    - ``save_on_exception``: ``exception-step_{s}`` (padded likewise) when training raises (best effort:
      the state may be mid-batch, so it is for salvage rather than exact resume; in
      distributed training it waits for every rank, so only when all of them fail);
    - ``topk``: the ``topk`` best evaluations by ``monitor``, as
      ``topk-{monitor}_{value}-step_{s}`` (padded); ``monitor``/``larger_better`` default to the Trainer's.
      :attr:`best_checkpoint` is the best of them; ``load_best_model_at_end=True`` loads its weights
      into the model when training ends normally (after ``last`` is written).

    Frozen parameters (a base model under an adapter) are left out of every save and fingerprinted in
    its manifest, unless ``save_frozen=True`` (see ``Trainer.save_checkpoint``).

    ``background=True``: periodic and top-k saves stop the loop only while the state is copied to host
    memory; a worker thread writes the files (checksums, manifest, rename into place) while training goes on,
    and old checkpoints are rotated out only once the new one is in place. At most one save is in flight: the
    next save (and the end of the run) first waits for it. A write that failed raises in the loop at the next
    save, at the next check that finds it finished, or when training ends, like a foreground save's error.
    ``last`` and ``exception-...`` are written in the foreground, after the save in flight. When training
    raises, the save in flight is still completed (in a distributed run, a sharded one only with
    ``save_on_exception``, whose save joins every rank anyway; otherwise its temporary folder is left for the
    next resume to remove) and a failure of it is a warning, not a replacement of the training error.
    A distributed run commits a background save (the ranks agree that every file is written; a sharded save's
    manifest and rename) on the main thread of every rank, at a step boundary checked 1, 3, 7, 15, ...
    batches after the save (the gap doubling), so the worker threads never call a collective.

    ``save_object="trainer"`` writes full checkpoints (resumable, see
    ``Trainer.save_checkpoint``); ``"model"`` writes only ``model.safetensors``
    (``Trainer.save_model``, loadable with ``Trainer.load_model``).

    When a save is due (a batch or epoch count is reached, an evaluation enters the
    top k) it is written at the next point where that step is complete: before the
    next batch is fetched, when the next epoch begins, or when training ends. So the
    checkpoint holds the evaluation of that step and what every other callback did
    for it, whatever their order in ``callbacks=``, and a resumed run repeats
    nothing and skips nothing. The list of checkpoints this callback manages travels
    in its own checkpoint state, so a resumed run continues the same rotation and top-k.

    The clock of ``every_n_seconds``: a single process reads :attr:`clock` (``time.monotonic``;
    a test may replace it on an instance) after every batch. In a distributed run rank 0's clock
    decides and a broadcast shares its decision, so every rank saves at the same step; to keep
    collectives off most batches, each check also tells every rank when to check next: after about
    half the time left until the save is due, at the pace rank 0 measured since its previous check
    (at least one batch). So a run makes a few checks per interval (about log2 of the batches in it),
    and a save comes at most about a batch late unless batches become more than twice as slow.

    Args:
        folder: the folder the checkpoints are written under, one sub-folder each.
        every_n_batches: save every this many batches of the run.
        every_n_epochs: save every this many epochs.
        every_n_seconds: save once this much wall time passed since training began or the last save.
        save_last: save ``last`` when training ends normally (finished or early-stopped).
        save_on_exception: save ``exception-step_{s}`` when training raises (for salvage, not exact resume).
        topk: keep the ``topk`` best evaluations by ``monitor`` (0: none).
        monitor: the result that ranks the top-k checkpoints (default: the Trainer's).
        larger_better: whether a larger ``monitor`` value is better (default: the Trainer's).
        save_object: ``"trainer"``: resumable checkpoints; ``"model"``: the weights only.
        keep_last_n: keep at most this many periodic checkpoints, deleting the oldest (None: all).
        save_total_limit: Hugging Face's name for ``keep_last_n``; give one of the two.
        load_best_model_at_end: load the best top-k checkpoint's weights when training ends normally.
        allow_pickle: pickle callback states that are not plain data.
        save_frozen: also write frozen parameters (a base model under an adapter).
        background: write periodic and top-k checkpoints on a worker thread while training goes on (the loop
            waits only for the copy of the state to host memory; needs ``save_object="trainer"``).

    Raises:
        ConfigurationError: an argument is wrong (a count below 1, ``topk`` without evaluation, both
            ``keep_last_n`` and ``save_total_limit``...); the message names the fix.
    """

    # Its state: the phase of the run (_Phase), the saves that are due (_Due), and the checkpoints it
    # keeps (_periodic, _best). The events:
    #   on_train_begin        any phase -> BETWEEN_EPOCHS; nothing due
    #   on_train_epoch_begin  write what is due (at the epoch's start) -> IN_EPOCH
    #   on_fetch_data_begin   write what is due (after the batches done), if anything is
    #   on_train_batch_end    a periodic save is due every every_n_batches batches, or once
    #                         every_n_seconds have passed
    #   on_train_epoch_end    IN_EPOCH -> BETWEEN_EPOCHS; a periodic save is due every every_n_epochs
    #   on_evaluate_end       a top-k value is due (saved at once in IDLE)
    #   on_exception          (not EarlyStopException) -> FAILED; write exception-... if asked
    #   on_train_end          -> IDLE; unless FAILED, write what is due, then last, then load the
    #                         best weights if load_best_model_at_end

    rank_zero_only = False  # every rank must call save_checkpoint (it writes on rank 0 and waits)
    clock = staticmethod(time.monotonic)  # what every_n_seconds reads (rank 0's, in distributed runs)

    def __init__(
        self,
        folder: str | os.PathLike,
        *,
        every_n_batches: int | None = None,
        every_n_epochs: int | None = None,
        every_n_seconds: float | None = None,
        save_last: bool = True,
        save_on_exception: bool = False,
        topk: int = 0,
        monitor: Any = None,
        larger_better: bool | None = None,
        save_object: str = "trainer",
        keep_last_n: int | None = None,
        save_total_limit: int | None = None,
        load_best_model_at_end: bool = False,
        allow_pickle: bool = False,
        save_frozen: bool = False,
        background: bool = False,
    ) -> None:
        limit_name, limit = _keep_last_n(keep_last_n, save_total_limit)
        _check_options(folder, every_n_batches=every_n_batches, every_n_epochs=every_n_epochs,
                       every_n_seconds=every_n_seconds, save_last=save_last, save_on_exception=save_on_exception,
                       topk=topk, monitor=monitor, larger_better=larger_better, save_object=save_object,
                       limit_name=limit_name, limit=limit, load_best_model_at_end=load_best_model_at_end,
                       allow_pickle=allow_pickle, save_frozen=save_frozen, background=background)
        self.folder = os.path.abspath(os.fspath(folder))
        self.every_n_batches = every_n_batches
        self.every_n_epochs = every_n_epochs
        self.every_n_seconds = every_n_seconds
        self.save_last = save_last
        self.save_on_exception = save_on_exception
        self.topk = topk
        self.monitor = monitor
        self.larger_better = larger_better
        self.save_object = save_object
        self.keep_last_n: int | None = limit  # also readable and settable as save_total_limit (HF's name)
        self.load_best_model_at_end = load_best_model_at_end
        self.allow_pickle = allow_pickle
        self.save_frozen = save_frozen
        self.background = background
        self._pending: _Pending | None = None  # background=True: the save in flight
        self._buffers = HostBuffers() if background else None  # the host memory its copies reuse
        self._removals: list[threading.Thread] = []  # background=True: old checkpoints' files being deleted
        self._monitor: Any = None  # the top-k monitor and direction, resolved against the trainer
        self._larger_better = True
        self._phase = _Phase.IDLE
        self._due = _Due()
        # The checkpoints kept (they travel in this callback's checkpoint state):
        self._periodic: list[str] = []  # names of periodic checkpoints, oldest first
        self._last_periodic_step: int | None = None
        self._best: list[tuple[str, float]] = []  # top-k (name, value), best first
        self._timer = _Timer()  # every_n_seconds: when the last periodic save was written, and when to check

    def request_save(self) -> None:
        """Make a periodic save due now: it is written where this step is complete (at the latest when training
        ends), as if a count had been reached (``PreemptionCallback`` asks for one when ``save_last=False``)."""
        self._due.periodic = True

    @property
    def callback_name(self) -> str:
        """Includes the folder's name, so a periodic and a best-model callback can be used together."""
        return f"{_OWNER}:{os.path.basename(self.folder)}"

    @property
    def save_total_limit(self) -> int | None:
        """Hugging Face's name for :attr:`keep_last_n`."""
        return self.keep_last_n

    @save_total_limit.setter
    def save_total_limit(self, value: int | None) -> None:
        self.keep_last_n = value

    @property
    def best_checkpoint(self) -> str | None:
        """The absolute path of the best top-k checkpoint this callback keeps; None before the first one.

        It is the head of the top-k list: the checkpoints this callback saved, and those it took over
        from the checkpoint a run resumed from (the folder is not scanned). Every rank of a distributed
        run holds the same list (the rankings come from evaluation results every rank shares, and a
        resume takes rank 0's list), so reading it needs no collective.
        """
        return os.path.join(self.folder, self._best[0][0]) if self._best else None

    # ------------------------------------------------------------------ events
    def on_after_trainer_initialized(self, trainer: Any, driver: Any) -> None:
        if self.topk:
            self._monitor, self._larger_better = resolve_monitor(
                _OWNER, f"topk={self.topk}", self.monitor, self.larger_better, trainer)
        loaders = [cb.folder for cb in checkpoint_callbacks(trainer) if cb.load_best_model_at_end]
        if len(loaders) > 1:
            raise ConfigurationError(
                f"{_OWNER}(load_best_model_at_end=True) is set on {len(loaders)} CheckpointCallbacks (folders "
                f"{', '.join(map(repr, loaders))}), but the model can take only one best; set it on one of them.")

    def on_train_begin(self, trainer: Any) -> None:
        self._phase, self._due = _Phase.BETWEEN_EPOCHS, _Due()
        if self.every_n_seconds is not None:
            self._timer.start(self.clock(), trainer.global_forward_batches)

    def on_train_epoch_begin(self, trainer: Any) -> None:
        self._write_due(trainer, in_epoch=False)  # what the end of the previous epoch made due
        self._phase = _Phase.IN_EPOCH

    def on_fetch_data_begin(self, trainer: Any) -> None:
        pending = self._pending
        if pending is not None and trainer.global_forward_batches >= pending.check_at:
            self._check_pending(trainer, pending)
        due = self._due  # called before every batch: the usual case, nothing due, costs three checks
        if due.periodic or due.best is not None:
            self._write_due(trainer, in_epoch=True)

    def on_train_batch_end(self, trainer: Any) -> None:
        if self.every_n_batches and trainer.global_forward_batches % self.every_n_batches == 0:
            self._due.periodic = True
        if self.every_n_seconds is not None and self._time_is_up(trainer):
            self._due.periodic = True

    def on_train_epoch_end(self, trainer: Any) -> None:
        if self._phase is _Phase.IN_EPOCH:
            self._phase = _Phase.BETWEEN_EPOCHS
        if self.every_n_epochs and trainer.cur_epoch_idx % self.every_n_epochs == 0:
            self._due.periodic = True

    def on_evaluate_end(self, trainer: Any, results: Any) -> None:
        if not self.topk:
            return
        value = trainer.monitor_value(results, self._monitor)
        if not self._qualifies(value):
            return
        if self._phase is _Phase.IDLE:  # trainer.evaluate() outside run(): nothing else is coming, save now
            self._save_best(trainer, value)
        elif self._due.best is None or is_better(value, self._due.best, self._larger_better):
            self._due.best = value  # two evaluations of one state (batch and epoch end): keep the better

    def on_exception(self, trainer: Any, exception: BaseException) -> None:
        if isinstance(exception, EarlyStopException):
            return  # a normal end: `last` is still written
        self._phase = _Phase.FAILED
        # A single process commits alone; with several, the commit joins every rank, as the exception save does.
        self._settle_pending(trainer, exception, commit=self.save_on_exception or not trainer.driver.is_distributed())
        if not self.save_on_exception:
            return
        name = f"exception-{step_label(trainer.global_forward_batches)}"
        try:
            self._save(trainer, name, foreground=True)
        except Exception as exc:  # the training error matters more than this one
            warnings.warn(f"{_OWNER} could not save {os.path.join(self.folder, name)} after "
                          f"{type(exception).__name__}: {type(exc).__name__}: {exc}", RuntimeWarning, stacklevel=2)

    def on_train_end(self, trainer: Any) -> None:
        phase, self._phase = self._phase, _Phase.IDLE
        if phase is _Phase.FAILED:
            self._due = _Due()  # the state may be mid-batch: not resumable
            self._settle_pending(trainer, None, commit=not trainer.driver.is_distributed())
            self._join_removals()
            return
        self._write_due(trainer, in_epoch=phase is _Phase.IN_EPOCH)
        try:
            self._finish_pending(trainer)  # the run ends with every save in place, or raises why one is not
        finally:
            self._join_removals()
        if self.save_last:
            self._save(trainer, LAST, foreground=True)
        if self.load_best_model_at_end:
            if self._best:
                load_best(trainer, self, f"{_OWNER}(load_best_model_at_end=True)")
            else:
                warnings.warn(
                    f"{_OWNER}(load_best_model_at_end=True): no top-k checkpoint was saved in {self.folder} (no "
                    f"evaluation gave {monitor_label(self._monitor)!r} a value that is not NaN), so the model "
                    "keeps the weights training ended with.", RuntimeWarning, stacklevel=2)

    # ------------------------------------------------------------------- state
    def on_save_checkpoint(self, trainer: Any) -> dict[str, Any]:
        return {
            "periodic": list(self._periodic),
            "last_periodic_step": self._last_periodic_step,
            "topk": [[name, value] for name, value in self._best],
            "monitor": monitor_label(self._monitor) if self.topk else None,
        }

    def on_load_checkpoint(self, trainer: Any, states: Any) -> None:
        """Take back the managed lists, keeping only our own names that still exist in ``folder``."""
        if not isinstance(states, dict):
            return
        periodic = [n for n in states.get("periodic", []) if self._is_ours(n, _PERIODIC)]
        best = [(n, float(v)) for n, v in states.get("topk", []) if self._is_ours(n, _TOPK)]
        driver = getattr(trainer, "driver", None)
        if driver is not None and driver.is_distributed():
            # Rank 0 writes and deletes, so its view of the folder decides; every rank must then
            # make the same top-k decisions, or one would wait in save_checkpoint for the others.
            periodic, best = driver.broadcast_object((periodic, best), src=0)
        self._periodic = list(periodic)
        step = states.get("last_periodic_step")
        self._last_periodic_step = step if isinstance(step, int) else None
        if best and states.get("monitor") != monitor_label(self._monitor):
            warnings.warn(
                f"{_OWNER}: the checkpoint's top-k list was ranked by {states.get('monitor')!r}, this run "
                f"monitors {monitor_label(self._monitor)!r}; starting a new top-k list (the old folders stay).",
                RuntimeWarning, stacklevel=2)
            best = []
        self._best = self._sorted([tuple(e) for e in best])

    # ----------------------------------------------------------------- helpers
    def _time_is_up(self, trainer: Any) -> bool:
        """Whether ``every_n_seconds`` have passed: this clock alone, or rank 0's shared at its checks."""
        timer, driver = self._timer, trainer.driver
        if not driver.is_distributed():
            return self.clock() - timer.since >= float(self.every_n_seconds or 0)
        step = trainer.global_forward_batches
        if step < timer.next_check:
            return False
        decision = None
        if driver.is_global_zero:
            decision = timer.decide(self.clock(), step, float(self.every_n_seconds or 0))
        due, wait = driver.broadcast_object(decision, src=0)
        timer.next_check = step + wait
        return bool(due)

    def _write_due(self, trainer: Any, in_epoch: bool) -> None:
        """Write the saves that are due; the position is (epoch, batches done in it) as a resume sees it."""
        due = self._due
        if due.periodic:
            due.periodic = False
            self._save_periodic(trainer, trainer.cur_epoch_idx, trainer.batch_idx_in_epoch if in_epoch else 0)
        if due.best is not None:
            value, due.best = due.best, None
            if self._qualifies(value):
                self._save_best(trainer, value)

    def _save_periodic(self, trainer: Any, epoch: int, batches: int) -> None:
        step = trainer.global_forward_batches
        if step == self._last_periodic_step:
            return  # this state is saved already (a resume that re-runs the end of an epoch)
        name = f"{step_label(step)}-epoch_{epoch}-batch_{batches}"
        self._finish_pending(trainer)  # before the lists change: its own rotation uses them
        previous = list(self._periodic), self._last_periodic_step
        self._periodic = [n for n in self._periodic if n != name] + [name]
        self._last_periodic_step = step

        def failed() -> None:
            self._periodic, self._last_periodic_step = previous

        def rotate() -> None:
            limit = self.keep_last_n
            if limit is not None and len(self._periodic) > limit:
                # The newest (just completed) is last in the list and limit >= 1: it is never deleted.
                doomed, self._periodic = self._periodic[:-limit], self._periodic[-limit:]
                for old in doomed:
                    self._remove(trainer, old)

        self._save(trainer, name, done=rotate, failed=failed)
        if self.every_n_seconds is not None:
            self._timer.since = self.clock()  # the next timed save counts from the end of this one (its copy)

    def _qualifies(self, value: float) -> bool:
        if math.isnan(value):
            return False
        return len(self._best) < self.topk or is_better(value, self._best[self.topk - 1][1], self._larger_better)

    def _save_best(self, trainer: Any, value: float) -> None:
        name = f"topk-{monitor_label(self._monitor)}_{value:.6g}-{step_label(trainer.global_forward_batches)}"
        self._finish_pending(trainer)  # before the list changes: its own trimming uses it
        previous = list(self._best)
        # Listed before saving, so the state inside the new checkpoint includes it.
        self._best = self._sorted([e for e in self._best if e[0] != name] + [(name, value)])

        def failed() -> None:
            self._best = previous

        self._save(trainer, name, done=lambda: self._trim_best(trainer), failed=failed,
                   foreground=self._phase is _Phase.IDLE)

    def _trim_best(self, trainer: Any) -> None:
        if len(self._best) > self.topk:
            doomed, self._best = self._best[self.topk:], self._best[:self.topk]
            for name, _ in doomed:
                self._remove(trainer, name)

    def _sorted(self, entries: list[tuple[str, float]]) -> list[tuple[str, float]]:
        """Best first; among equal values the earlier one stays ahead (stable sort)."""
        return sorted(entries, key=lambda e: e[1], reverse=self._larger_better)

    def _save(self, trainer: Any, name: str, *, done: Callable[[], None] = lambda: None,
              failed: Callable[[], None] = lambda: None, foreground: bool = False) -> None:
        """Save ``name``, then ``done()`` (rotation); ``failed()`` undoes the bookkeeping of a save that failed.
        With ``background`` (unless ``foreground``) the save is left in flight and both run when it is settled."""
        self._finish_pending(trainer)  # at most one save in flight
        path = os.path.join(self.folder, name)
        try:
            if self.background and not foreground:
                save = trainer._start_checkpoint(path, allow_pickle=self.allow_pickle, save_frozen=self.save_frozen,
                                                 buffers=self._buffers)
                self._pending = _Pending(save, done, failed, check_at=trainer.global_forward_batches + 1)
                return
            if self.save_object == "trainer":
                trainer.save_checkpoint(path, allow_pickle=self.allow_pickle, save_frozen=self.save_frozen)
            else:  # atomic like a checkpoint; every rank calls it, rank 0 writes
                trainer.save_model(path, save_frozen=self.save_frozen)
        except BaseException:
            failed()
            raise
        done()

    def _check_pending(self, trainer: Any, pending: _Pending) -> None:
        """At a step boundary: commit the save in flight if its writer (every rank's) has finished, else check
        again later (one process: at the next batch; distributed: after twice the gap, the same on every rank)."""
        if pending.save.all_written():
            self._finish_pending(trainer)
        elif trainer.driver.is_distributed():
            pending.gap *= 2
            pending.check_at = trainer.global_forward_batches + pending.gap

    def _finish_pending(self, trainer: Any) -> None:
        """Every rank: wait for the save in flight and commit it, then rotate; raises what it failed with."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        try:
            pending.save.finish()
        except BaseException:
            pending.failed()
            raise
        pending.done()

    def _join_removals(self) -> None:
        """Wait for old checkpoints' files to be deleted, so that a run leaves its folder tidy."""
        removals, self._removals = self._removals, []
        for thread in removals:
            thread.join()

    def _settle_pending(self, trainer: Any, exception: BaseException | None, commit: bool) -> None:
        """Training failed: complete the save in flight (``commit``: also the commit, which in a distributed run
        joins every rank) without letting its failure replace the training error: it is a warning."""
        pending = self._pending
        if pending is None:
            return
        try:
            if commit:
                self._finish_pending(trainer)
                return
            self._pending = None
            error = pending.save.wait()  # a whole-state save is complete on rank 0; a sharded one stays temporary
            if error is not None:
                raise error
            if trainer.driver.is_global_zero and not os.path.isdir(pending.save.folder):
                logger.warning("%s: the background save %s was written but not committed (the commit of a sharded "
                               "save joins every rank, and training failed); the next resume removes its temporary "
                               "folder.", _OWNER, pending.save.folder)
        except Exception as exc:
            after = f" after {type(exception).__name__}" if exception is not None else ""
            warnings.warn(f"{_OWNER}: the background save {pending.save.folder} failed{after}: "
                          f"{type(exc).__name__}: {exc}", RuntimeWarning, stacklevel=2)

    def _remove(self, trainer: Any, name: str) -> None:
        if not trainer.driver.is_global_zero:
            return
        path = os.path.join(self.folder, name)
        if not os.path.isdir(path):
            return  # already gone (removed by hand, or by the run this one resumed)
        try:
            removal = remove_checkpoint(path, background=self.background)  # the loop need not wait for the files
        except OSError as exc:
            warnings.warn(f"{_OWNER} could not delete the old checkpoint {path}: {exc}", RuntimeWarning, stacklevel=3)
            return
        if removal is not None:
            self._removals = [t for t in self._removals if t.is_alive()] + [removal]

    def _is_ours(self, name: Any, pattern: re.Pattern) -> bool:
        """Only names this callback makes, directly in ``folder``: a checkpoint's state never points elsewhere."""
        return (isinstance(name, str) and pattern.fullmatch(name) is not None
                and os.path.isdir(os.path.join(self.folder, name)))


def checkpoint_callbacks(trainer: Any) -> list[CheckpointCallback]:
    """The trainer's CheckpointCallbacks, in the order of ``callbacks=``."""
    return [cb for cb in trainer.callbacks if isinstance(cb, CheckpointCallback)]


def best_checkpoint(trainer: Any) -> str | None:
    """``Trainer.best_checkpoint``: the best checkpoint of the first CheckpointCallback with ``topk``, or None."""
    keepers = [cb for cb in checkpoint_callbacks(trainer) if cb.topk]
    return keepers[0].best_checkpoint if keepers else None


def load_best_model(trainer: Any) -> str:
    """``Trainer.load_best_model()``: load the weights of :func:`best_checkpoint`; returns its path."""
    callbacks = checkpoint_callbacks(trainer)
    keepers = [cb for cb in callbacks if cb.topk]
    who = "Trainer.load_best_model()"
    if not keepers:
        have = (f" (its CheckpointCallback(s) in {', '.join(repr(cb.folder) for cb in callbacks)} keep no top-k)"
                if callbacks else "")
        raise ConfigurationError(
            f"{who} loads the best checkpoint of a CheckpointCallback with topk >= 1, and this trainer has "
            f"none{have}; add CheckpointCallback(folder, topk=1) to callbacks= (it ranks evaluations by the "
            "Trainer's monitor, or pass monitor=), or load a folder of your choice with trainer.load_model(folder).")
    keeper = keepers[0]
    if keeper.best_checkpoint is None:
        raise ConfigurationError(
            f"{who}: CheckpointCallback({keeper.folder!r}, topk={keeper.topk}) has saved no top-k checkpoint "
            f"yet (none until an evaluation gives {monitor_label(keeper._monitor)!r} a value that is not NaN); "
            "call it after trainer.run() or trainer.evaluate(), or after loading a checkpoint of the run that "
            "saved them (trainer.load_checkpoint(...), run(resume_from=...)).")
    return load_best(trainer, keeper, who)


def load_best(trainer: Any, keeper: CheckpointCallback, who: str) -> str:
    """Load ``keeper``'s best checkpoint into the model on every rank; rank 0 names it (every rank calls this)."""
    decision: tuple[str | None, str | None] = (keeper.best_checkpoint, None)
    driver = trainer.driver
    if driver.is_global_zero and decision[0] is not None and not os.path.isdir(decision[0]):
        decision = (None, f"{who}: the best checkpoint {decision[0]} (top-k by "
                          f"{monitor_label(keeper._monitor)!r}) no longer exists; it was deleted or moved after "
                          "it was saved. Load another folder with trainer.load_model(folder).")
    if driver.is_distributed():
        decision = driver.broadcast_object(decision, src=0)  # every rank loads the folder rank 0 names
    path, error = decision
    if error is not None or path is None:
        raise CheckpointError(error or f"{who}: rank 0 has no best checkpoint")
    trainer.load_model(path)
    return path


def step_label(step: int) -> str:
    """``step_00000012``: zero-padded, so folder names sort in step order as plain strings (up to 10**8 - 1)."""
    return f"step_{step:0{STEP_DIGITS}d}"


def _keep_last_n(keep_last_n: Any, save_total_limit: Any) -> tuple[str, Any]:
    """The periodic-checkpoint limit, under the one of its two names that was given (refusing both)."""
    if keep_last_n is not None and save_total_limit is not None:
        raise ConfigurationError(
            f"{_OWNER}(keep_last_n={keep_last_n!r}, save_total_limit={save_total_limit!r}) gives one setting "
            "twice: save_total_limit is Hugging Face's name for keep_last_n; pass only keep_last_n."
        )
    return ("save_total_limit", save_total_limit) if save_total_limit is not None else ("keep_last_n", keep_last_n)


def _check_options(folder: Any, **given: Any) -> None:
    """Every argument, alone and together, before anything is stored (``limit`` is given as ``limit_name``)."""
    _check_folder(folder)
    check_optional_int(_OWNER, "every_n_batches", given["every_n_batches"], minimum=1,
                       none_means="no batch-based saves")
    check_optional_int(_OWNER, "every_n_epochs", given["every_n_epochs"], minimum=1, none_means="no epoch-based saves")
    seconds = given["every_n_seconds"]
    if seconds is not None and not (isinstance(seconds, (int, float)) and not isinstance(seconds, bool)
                                    and math.isfinite(seconds) and seconds > 0):
        raise ConfigurationError(
            f"{_OWNER}(every_n_seconds={seconds!r}) is not accepted; pass a number of seconds > 0 (an int or a "
            "float, such as 1800 for every half hour), or None for no time-based saves."
        )
    limit_name, limit = given["limit_name"], given["limit"]
    check_optional_int(_OWNER, limit_name, limit, minimum=1, none_means="keeping them all")
    for name in ("save_last", "save_on_exception", "load_best_model_at_end", "allow_pickle", "save_frozen",
                 "background"):
        check_bool(_OWNER, name, given[name])
    topk, save_object = given["topk"], given["save_object"]
    if not isinstance(topk, int) or isinstance(topk, bool) or topk < 0:
        raise ConfigurationError(
            f"{_OWNER}(topk={topk!r}) is not accepted; pass an int >= 0 (0 = no top-k checkpoints)."
        )
    check_monitor_arg(_OWNER, given["monitor"], given["larger_better"])
    if save_object not in SAVE_OBJECTS:
        raise ConfigurationError(
            f"{_OWNER}(save_object={save_object!r}) is not accepted; pass 'trainer' (a resumable "
            "checkpoint) or 'model' (the model's weights only)."
        )
    periodic = any(given[name] is not None for name in ("every_n_batches", "every_n_epochs", "every_n_seconds"))
    if not (periodic or given["save_last"] or given["save_on_exception"] or topk):
        raise ConfigurationError(
            f"{_OWNER}({os.fspath(folder)!r}) saves nothing: set every_n_batches, every_n_epochs, save_last, "
            "save_on_exception or topk, or every_n_seconds for time-based saves."
        )
    if limit is not None and not periodic:
        raise ConfigurationError(
            f"{_OWNER}({limit_name}={limit!r}) limits periodic checkpoints, but neither every_n_batches nor "
            f"every_n_epochs nor every_n_seconds is set; set one of them or drop {limit_name}."
        )
    if not topk and (given["monitor"] is not None or given["larger_better"] is not None):
        raise ConfigurationError(
            f"{_OWNER}: monitor/larger_better are used only for top-k checkpoints, but topk=0; "
            "pass topk=k (k >= 1) or drop monitor/larger_better."
        )
    if not topk and given["load_best_model_at_end"]:
        raise ConfigurationError(
            f"{_OWNER}(load_best_model_at_end=True) loads the best top-k checkpoint, but topk=0 keeps none; "
            "pass topk=1 (ranked by monitor=, or the Trainer's monitor) or drop load_best_model_at_end."
        )
    if given["background"] and save_object == "model":
        raise ConfigurationError(
            f"{_OWNER}(background=True) writes resumable checkpoints on a worker thread, and save_object='model' "
            "writes weights only in the foreground; use save_object='trainer' or drop background."
        )
    if given["allow_pickle"] and save_object == "model":
        raise ConfigurationError(
            f"{_OWNER}(allow_pickle=True) has no effect with save_object='model' (model files never "
            "pickle); drop allow_pickle or use save_object='trainer'."
        )


def _check_folder(folder: Any) -> None:
    if not isinstance(folder, (str, os.PathLike)) or not os.fspath(folder):
        raise ConfigurationError(
            f"{_OWNER}(folder={folder!r}) is not accepted; pass the path of a folder to write checkpoints into."
        )
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise ConfigurationError(
            f"{_OWNER}(folder={os.fspath(folder)!r}) is an existing file; pass a folder path (it is created if missing)."
        )
