"""Stopping for the cluster: a signal (Slurm's ``--signal=USR1@90``) ends training at a step boundary with a
checkpoint, and the job is requeued to resume from it.

The signal handler only raises a flag. Every rank stops at the same step: one process checks its flag after
each batch; several agree every ``check_every_n_batches`` batches (one small gather), so all of them end the
same step, save the same checkpoint and close their records as ``preempted``. The checkpoint is the
``CheckpointCallback``'s (its ``last``, or a periodic one when ``save_last=False``), so
``resume_from="latest"`` in the requeued job continues exactly. Rank 0 then runs ``scontrol requeue`` once,
when the job can be requeued.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from types import FrameType
from typing import Any

from .._common import ConfigurationError, Preempted, logger
from .base import Callback
from .checkpoint import CheckpointCallback

_REQUEUE_TIMEOUT = 30.0


class PreemptionCallback(Callback):
    """End training cleanly when the cluster sends ``signal``, save a checkpoint, and requeue the job.

    The Trainer adds one (with these defaults) to a run under Slurm (``SLURM_JOB_ID`` set) that has a
    ``CheckpointCallback`` saving resumable checkpoints, unless ``callbacks=`` holds one already. Ask Slurm
    to send the signal before the end: ``#SBATCH --signal=USR1@90`` (to the tasks, 90 s before the time
    limit) and ``#SBATCH --requeue``; ``scancel --signal=USR1 <job>`` sends it by hand.

    Args:
        signal: the signal that asks the run to stop, by name or number (default SIGUSR1).
        requeue: ``True``: run ``scontrol requeue $SLURM_JOB_ID`` after saving; ``False``: never; ``None``
            (default): when the job was submitted requeueable (``--requeue``, Slurm's ``Requeue=1``).
        check_every_n_batches: with several processes, how often they agree whether one was signalled (a
            small gather each time); they stop at the first agreement after the signal.

    Raises:
        ConfigurationError: an unknown signal or a ``check_every_n_batches`` below 1.
    """

    def __init__(self, signal: str | int = "SIGUSR1", *, requeue: bool | None = None,
                 check_every_n_batches: int = 10) -> None:
        self.signum = _signal_number(signal)
        if requeue not in (None, True, False):
            raise ConfigurationError(f"PreemptionCallback(requeue={requeue!r}): use True, False or None.")
        if isinstance(check_every_n_batches, bool) or not isinstance(check_every_n_batches, int) \
                or check_every_n_batches < 1:
            raise ConfigurationError(f"PreemptionCallback(check_every_n_batches={check_every_n_batches!r}): "
                                     "use a whole number of batches >= 1.")
        self.requeue = requeue
        self.check_every_n_batches = check_every_n_batches
        self.asked = False  # the signal arrived (on this process)
        self.preempted = False  # training stopped for it
        self._previous: Any = None

    # ------------------------------------------------------------------ the signal
    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.asked = True

    def on_train_begin(self, trainer: Any) -> None:
        self.asked = self.preempted = False
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(self.signum, self._on_signal)

    def on_train_batch_end(self, trainer: Any) -> None:
        driver = trainer.driver
        if not driver.is_distributed():
            stop = self.asked
        elif trainer.global_forward_batches % self.check_every_n_batches == 0:
            stop = any(driver.all_gather_object(self.asked))
        else:
            return
        if stop:
            self.preempted = True
            for keeper in trainer.callbacks:
                if isinstance(keeper, CheckpointCallback) and not keeper.save_last:
                    keeper.request_save()
            raise Preempted(f"stopped at step {trainer.global_forward_batches} by {signal.Signals(self.signum).name}")

    def on_train_end(self, trainer: Any) -> None:
        if self._previous is not None:
            signal.signal(self.signum, self._previous)
            self._previous = None
        if not self.preempted:
            return
        saved = [keeper.folder for keeper in trainer.callbacks if isinstance(keeper, CheckpointCallback)]
        requeued = self._requeue() if trainer.driver.is_global_zero else False
        if trainer.driver.is_global_zero:
            logger.warning("preempted at step %d (%s): checkpoint in %s%s.", trainer.global_forward_batches,
                           signal.Signals(self.signum).name, ", ".join(saved) or "no folder (no CheckpointCallback)",
                           "; the job is requeued and resume_from='latest' continues it" if requeued else "")

    def _requeue(self) -> bool:
        job = os.environ.get("SLURM_JOB_ID")
        if not job or self.requeue is False:
            return False
        if self.requeue is None and not _requeueable(job):
            return False
        try:
            subprocess.run(["scontrol", "requeue", job], check=True, capture_output=True, text=True,
                           timeout=_REQUEUE_TIMEOUT)
        except (OSError, subprocess.SubprocessError) as exc:
            detail = getattr(exc, "stderr", "") or exc
            logger.warning("scontrol requeue %s failed (%s): requeue the job by hand (scontrol requeue %s) and "
                           "resume with resume_from='latest'.", job, str(detail).strip(), job)
            return False
        return True


def _requeueable(job: str) -> bool:
    """Whether Slurm will requeue ``job`` (``Requeue=1`` in ``scontrol show job``)."""
    try:
        shown = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True,
                               timeout=_REQUEUE_TIMEOUT).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return "Requeue=1" in shown


def _signal_number(given: str | int) -> int:
    if isinstance(given, bool):
        raise ConfigurationError(f"PreemptionCallback(signal={given!r}): name a signal, e.g. 'SIGUSR1'.")
    try:
        if isinstance(given, int):
            return int(signal.Signals(given))
        name = given.upper() if given.upper().startswith("SIG") else f"SIG{given.upper()}"
        return int(signal.Signals[name])
    except (KeyError, ValueError, AttributeError):
        raise ConfigurationError(f"PreemptionCallback(signal={given!r}) is not a signal of this system; use e.g. "
                                 "'SIGUSR1' (Slurm's --signal=USR1@90) or 'SIGUSR2'.") from None


def preemption_for(callbacks: list[Callback]) -> PreemptionCallback | None:
    """The PreemptionCallback a run under Slurm gets by default: one, unless ``callbacks`` hold one already or no
    CheckpointCallback saves resumable checkpoints (a stop would then lose the run: the signal's default
    action, ending the process, is kept)."""
    if not os.environ.get("SLURM_JOB_ID") or any(isinstance(cb, PreemptionCallback) for cb in callbacks):
        return None
    if not any(isinstance(cb, CheckpointCallback) and cb.save_object == "trainer" for cb in callbacks):
        return None
    return PreemptionCallback()
