"""The bound on how long one rank waits for the others: a thread that ends the process when a wait cannot end.

Some frameworks' collectives have no timeout (oneflow 0.9), others give up only after a
fixed time (paddle's gloo: 30 s), and a collective blocked in C++ cannot be interrupted
from Python. So a distributed driver runs every call that may wait for the other
processes under :meth:`Watchdog.watch`; a daemon thread watches the clock and, when one
call outlasts ``timeout``, or when a peer reported a failure (``peer_reports``) and the
call still has not returned ``peer_grace`` seconds later, hands a message naming this
rank and the operation to ``on_expiry``. By default that writes it to stderr as a
``DistributedError`` and ends the process with exit code 1, which is what a raised error
would do there (callbacks cannot run: the main thread is stuck in the framework), and
which makes the launcher (or the Trainer's supervisor) stop the other processes.

No framework is imported here; the thread only reads the clock and what the driver gives it.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from types import TracebackType

__all__ = ["PEER_GRACE", "Watchdog", "end_process"]

PEER_GRACE = 5.0
"""Seconds a watched call gets to fail by itself once a peer reported a failure (the peer first waits up to
1 s to see whether every process is failing, then exits, which normally breaks the call here)."""
_BOARD_EVERY = 0.5  # how often ``peer_reports`` is asked while a call is watched


def end_process(message: str, linger: float = 0.0) -> None:
    """The default ``on_expiry``: say why on stderr, as a raised error would, and exit with code 1.

    ``linger`` seconds pass between the two, for a framework that ends this process its own
    way once the failed peer exits (paddle's gloo reducer aborts it): the reason is out first.
    """
    sys.stdout.flush()
    sys.stderr.write(f"drivetrain: DistributedError: {message}\n")
    sys.stderr.flush()
    if linger > 0:
        time.sleep(linger)
    os._exit(1)


class Watchdog:
    """Ends the process when a watched operation of one rank cannot end (one instance per driver).

    ``limit`` is how the message names the timeout (default ``"<timeout> s"``; a backend
    names its option, ``"mxnet_kwargs['timeout']=60 s"``); ``advice`` is a sentence put
    before the closing one (what to raise, why the framework cannot stop by itself).
    ``peer_reports()`` returns ``{rank: what happened}`` for peers that failed (e.g.
    ``CollectiveGuard.reports_now``); ``on_start`` runs first in the watching thread
    (e.g. to open that thread's connection to a store while every peer is alive).
    ``on_expiry(message)`` is called once, from the thread, which then ends.
    """

    def __init__(self, rank: int, world_size: int, timeout: float, *, limit: str | None = None,
                 advice: str = "", peer_reports: Callable[[], Mapping[int, str]] | None = None,
                 peer_grace: float = PEER_GRACE, on_start: Callable[[], object] | None = None,
                 on_expiry: Callable[[str], object] = end_process, poll: float = 0.1) -> None:
        self.rank = rank
        self.world_size = world_size
        self.timeout = timeout
        self.limit = f"{timeout:g} s" if limit is None else limit
        self.advice = advice
        self.peer_grace = peer_grace
        self._peer_reports = peer_reports
        self._on_start = on_start
        self._on_expiry = on_expiry
        self._poll = max(min(poll, timeout / 4), 0.001)
        self._current: tuple[str, float] | None = None  # (operation, since): one attribute, read atomically
        self._depth = 0
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def watch(self, operation: str) -> _Watched:
        """A context manager: its body runs as ``operation``; nested watches count as the outermost one."""
        return _Watched(self, operation)

    @property
    def operation(self) -> str | None:
        """The operation being watched now (the outermost), or None."""
        current = self._current
        return None if current is None else current[0]

    def start(self) -> None:
        """Start the thread now (else it starts with the first watched operation)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="drivetrain-watchdog", daemon=True)
            self._thread.start()
            atexit.register(self.stop)

    def stop(self) -> None:
        """End the thread (also at exit: a thread still running while the interpreter finalises may abort it)."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=2.0)
            atexit.unregister(self.stop)

    def _enter(self, operation: str) -> None:
        if self._depth == 0:
            self._current = (operation, time.monotonic())
            if self._thread is None:
                self.start()
        self._depth += 1

    def _leave(self) -> None:
        self._depth -= 1
        if self._depth == 0:
            self._current = None

    def _run(self) -> None:
        if self._on_start is not None:
            self._on_start()
        noticed: tuple[tuple[str, float], float] | None = None  # (the call, when a peer's report was first seen)
        reports: Mapping[int, str] = {}
        asked = 0.0
        while not self._stop.wait(self._poll):
            current = self._current
            if current is None:
                noticed = None
                continue
            if noticed is not None and noticed[0] is not current:
                noticed = None
            now = time.monotonic()
            if self._peer_reports is not None and now - asked >= _BOARD_EVERY:
                asked = now
                fresh = self._peer_reports()
                if fresh:
                    reports = fresh  # the last words heard stay, should a later read of the board fail
                    if noticed is None:
                        noticed = (current, now)
            message = self._expired(current, noticed, reports, now)
            if message is not None and self._current is current and not self._stop.is_set():
                self._on_expiry(message)
                return

    def _expired(self, current: tuple[str, float], noticed: tuple[tuple[str, float], float] | None,
                 reports: Mapping[int, str], now: float) -> str | None:
        operation, since = current
        where = f"on rank {self.rank} of {self.world_size}"
        if noticed is not None and now - noticed[1] > self.peer_grace:
            cause = "; ".join(f"rank {r} {text}" for r, text in sorted(reports.items()))
            return (f"{operation} cannot finish {where} because {cause}. This process stops too; the cause is in "
                    "that rank's own output.")
        if now - since > self.timeout:
            return (f"{operation} {where}: another process did not answer within {self.limit} (stuck? killed?). "
                    f"{self.advice + ' ' if self.advice else ''}This process stops, so that the launcher stops the "
                    "others; look at the other processes' output.")
        return None


class _Watched:
    """What :meth:`Watchdog.watch` returns (a small class: drivers enter it on the hot path)."""

    __slots__ = ("_operation", "_watchdog")

    def __init__(self, watchdog: Watchdog, operation: str) -> None:
        self._watchdog = watchdog
        self._operation = operation

    def __enter__(self) -> None:
        self._watchdog._enter(self._operation)

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._watchdog._leave()
