"""SIGTERM during ``Trainer.run()``: an exception in the loop instead of a silent death.

Python's default for SIGTERM ends the process at once: no ``on_exception``, no checkpoint, no
closed records. Schedulers (SLURM, Kubernetes, torchrun when another rank failed) send SIGTERM
and only later SIGKILL, so for the span of ``run()`` the main thread turns the first SIGTERM
into :class:`~drivetrain.TrainingTerminated`; a second one ends the process the default way. A
handler the user installed is left alone, and so are threads other than the main one (only it
may set handlers).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

from ._errors import TrainingTerminated
from ._log import logger


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    signal.signal(signum, signal.SIG_DFL)  # a second SIGTERM while we save: end at once, as asked
    logger.warning("%s received: ending the run (on_exception handlers run first: a CheckpointCallback with "
                   "save_on_exception=True saves; a second %s ends the process at once).",
                   signal.Signals(signum).name, signal.Signals(signum).name)
    raise TrainingTerminated(signum)


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """Within the block, SIGTERM raises :class:`~drivetrain.TrainingTerminated` in the main thread."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return
    signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
