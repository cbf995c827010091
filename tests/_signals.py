"""Starting a child that a test will interrupt: with SIGINT at its default, whatever the test runner inherited.

A process started in the background by a non-interactive shell, or by a CI service, may inherit SIGINT
*ignored*; children inherit that too (``subprocess`` restores only SIGPIPE/SIGXFSZ), and Python then
installs no KeyboardInterrupt handler, so a Ctrl-C test's SIGINT does nothing and the child sleeps on.
That is what made the jittor Ctrl-C test fail in CI and pass when run by hand.
"""

from __future__ import annotations

import signal
import subprocess
import time
from typing import Any


def wait_for_a_signal(seconds: float) -> None:
    """Stand in for a long step in a child waiting to be signalled: up to ``seconds``, returning to Python every
    10 ms, as a real step does.

    Why not one ``time.sleep(seconds)``: the kernel may hand a signal sent to the process to any of its threads
    (a data loader's, jittor's or paddle's workers). Python runs the handler at the main thread's next bytecode,
    and a main thread asleep in one long sleep is not woken: seen under ``mpirun`` on a loaded machine, where
    rank 0 slept through mpirun's SIGTERM until its SIGKILL.
    """
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.01)


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def popen_interruptible(args: Any, **kwargs: Any) -> subprocess.Popen:
    """``subprocess.Popen`` whose child starts with SIGINT at its default (so Python raises KeyboardInterrupt)."""
    return subprocess.Popen(args, preexec_fn=_default_sigint, **kwargs)  # noqa: PLW1509 - no threads started yet


def read_until(proc: subprocess.Popen, wanted: str, what: str) -> None:
    """Read the child's stdout until the line ``wanted`` (the child's own "I am ready" signal); fail with its
    stderr if it ends or says something else first. No fixed sleep: the child says when it is ready."""
    for line in proc.stdout:
        if line.strip() == wanted:
            return
    raise AssertionError(f"{what}: the child ended before printing {wanted!r} (exit {proc.wait()}): "
                         f"{proc.stderr.read()[-2000:]}")


def run_until_ctrl_c(trainer: Any, step: int, **run_kwargs: Any) -> None:
    """``trainer.run(**run_kwargs)`` with a Ctrl-C (a KeyboardInterrupt) after global step ``step``; the interrupt
    must reach the caller, as Ctrl-C reaches a script."""
    import pytest

    from drivetrain import Event

    def interrupt(t: Any) -> None:
        if t.global_forward_batches == step:
            raise KeyboardInterrupt

    trainer.add_callback_fn(Event.on_train_batch_end(), interrupt)
    with pytest.raises(KeyboardInterrupt):
        trainer.run(**run_kwargs)
