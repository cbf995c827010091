"""SIGTERM (and, in a distributed run, SIGINT) during ``Trainer.run()``: an exception in the loop, raised once.

Python's default for SIGTERM ends the process at once: no ``on_exception``, no checkpoint, no
closed records. Schedulers (SLURM, Kubernetes, torchrun when another rank failed) send SIGTERM
and only later SIGKILL, so for the span of ``run()`` the main thread turns the first SIGTERM
into :class:`~drivetrain.TrainingTerminated`; in one process a second one ends the process the
default way. A handler the user installed is left alone, and so are threads other than the main
one (only it may set handlers).

In a distributed run every process often gets a stop signal twice: once from the terminal's Ctrl-C
(or the scheduler) and once more from the launcher, which passes the signal it got on to the
processes it started (torchrun, the Trainer's own ``nproc``). A second exception raised in the middle
of ``on_exception`` would skip the work that lets the ranks stop together (the exception checkpoint,
the records), so there the first SIGINT or SIGTERM raises and later ones are ignored until ``run()``
returns; a process that does not stop is killed by its launcher.

A Ctrl-C that leaves ``run()`` ends the script, as in any Python program (exit status 130), but
without a traceback per process: the run says in one line how it stopped (:func:`end_quietly`).
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from types import FrameType
from typing import Any

from .._common import TrainingTerminated, logger


def _ignore(signum: int, frame: FrameType | None) -> None:
    """A repeated stop signal in a distributed run: nothing to do. (A Python handler, not SIG_IGN: a signal that
    arrived together with the first would otherwise raise "OSError: Signal 15 ignored due to race condition".)"""


def _handler(then: Any, taken: Sequence[int]) -> Callable[[int, FrameType | None], None]:
    """A handler raising the signal's exception once; ``then`` is the disposition of every signal of ``taken``
    afterwards (a SIGTERM from the launcher right after the terminal's SIGINT is a repeat too)."""

    def raise_once(signum: int, frame: FrameType | None) -> None:
        for each in taken:
            signal.signal(each, then)
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        name = signal.Signals(signum).name
        alone = then is signal.SIG_DFL
        second = f"a second {name} ends the process at once" if alone else \
            "further stop signals are ignored: the launcher stops a process that does not end"
        say = logger.warning if alone else logger.info  # distributed: said once, by rank 0 (its level is info)
        say("%s received: ending the run (on_exception handlers run first: a CheckpointCallback with "
            "save_on_exception=True saves; %s).", name, second)
        raise TrainingTerminated(signum)

    return raise_once


@contextlib.contextmanager
def stop_signals_raise(distributed: bool) -> Iterator[None]:
    """Within the block, SIGTERM raises :class:`~drivetrain.TrainingTerminated` in the main thread; with
    ``distributed``, SIGINT raises KeyboardInterrupt once too, and a repeated signal is ignored (see above)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    defaults = {signal.SIGTERM: signal.SIG_DFL, signal.SIGINT: signal.default_int_handler}
    if not distributed:
        del defaults[signal.SIGINT]
    before = {signum: signal.getsignal(signum) for signum in defaults}
    taken = [signum for signum in defaults if before[signum] == defaults[signum]]  # a user's handler stays
    handler = _handler(_ignore if distributed else signal.SIG_DFL, taken)
    for signum in taken:
        signal.signal(signum, handler)
    try:
        yield
    finally:
        for signum in taken:
            signal.signal(signum, before[signum])


_QUIET = "_drivetrain_said"
_hooked = False


def end_quietly(exc: BaseException, line: str | None) -> None:
    """``exc`` (a Ctrl-C leaving ``run()``) ends the script with one line instead of a traceback.

    ``line`` (None: it was said already, by the progress display) is logged now, shown where drivetrain's
    info messages are: rank 0. If nothing catches
    ``exc``, Python still ends the process by SIGINT (status 130), but the traceback is left out: in a
    distributed run every process would print one, and none says more than this line. Any other
    exception reaches the previous ``sys.excepthook`` unchanged.
    """
    global _hooked
    if line is not None:
        logger.info("%s", line)
    setattr(exc, _QUIET, True)
    if _hooked:
        return
    _hooked = True
    previous = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        if not getattr(value, _QUIET, False):
            previous(kind, value, tb)

    sys.excepthook = hook
