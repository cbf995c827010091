"""The bound on waiting for other processes: a thread that ends this process when a collective cannot end.

A paddle collective blocked on a peer cannot be interrupted from Python: gloo gives up
by itself only after a fixed 30 s (a dead peer's closed connection is noticed at once,
and that error is raised normally). So while the main thread is inside a collective,
this thread watches the clock and the failure board. When a peer reported a failure and
the collective still has not returned shortly after, or the collective outlasts the
timeout, it writes the error (naming the peer when one said why) and exits with code 1,
which is what a raised error would do at that point; callbacks cannot run, since the
main thread is stuck in paddle's C++ code. Processes the Trainer started die with
their parent (the core launcher's ``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator

_POLL = 0.1
_BOARD_EVERY = 0.5
PEER_GRACE = 5.0
"""Seconds a collective gets to fail by itself once a peer reported a failure (the peer first waits up to
1 s to see whether every process is failing, then exits, which breaks the collective here)."""


class CollectiveWatch:
    """Watches the main thread's collectives of one rank (one instance per distributed driver)."""

    def __init__(self, rank: int, world_size: int, timeout: float, limit: str,
                 reports: Callable[[], dict[int, str]], on_start: Callable[[], None] | None = None) -> None:
        self.rank = rank
        self.world_size = world_size
        self.timeout = timeout
        self.limit = limit
        self._reports = reports
        self._on_start = on_start
        self._current: tuple[str, float] | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    @contextlib.contextmanager
    def section(self, what: str) -> Iterator[None]:
        """Mark the main thread as inside the collective ``what`` for the duration of the block."""
        outer = self._current
        if outer is None:
            self._current = (what, time.monotonic())
            self.start()
        try:
            yield
        finally:
            if outer is None:
                self._current = None

    def start(self) -> None:
        """Start watching (at the latest when the first collective begins)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="drivetrain-collective-watch", daemon=True)
            self._thread.start()
            atexit.register(self.stop)

    def stop(self) -> None:
        """End the thread (at exit: a thread still running while the interpreter finalises may abort it)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=2.0)

    def _run(self) -> None:
        if self._on_start is not None:
            self._on_start()
        seen_at: dict[tuple[str, float], float] = {}
        checked = 0.0
        reports: dict[int, str] = {}
        while not self._stop.wait(_POLL):
            current = self._current
            if current is None:
                seen_at.clear()
                continue
            what, started = current
            now = time.monotonic()
            if now - checked >= _BOARD_EVERY:
                checked = now
                reports = self._reports()
                if reports:
                    seen_at.setdefault(current, now)
            if current in seen_at and now - seen_at[current] > PEER_GRACE and self._current == current:
                cause = "; ".join(f"rank {r} {text}" for r, text in sorted(reports.items()))
                self._exit(f"{what} cannot finish on rank {self.rank} of {self.world_size} because {cause}. "
                           "This process stops too; the cause is in that rank's own output.")
            if now - started > self.timeout + _POLL and self._current == current:
                self._exit(f"{what} on rank {self.rank} of {self.world_size}: another process did not answer "
                           f"within {self.limit} (stuck? killed?). This process stops; look at the other "
                           "processes' output.")

    def _exit(self, message: str) -> None:
        sys.stdout.flush()
        sys.stderr.write(f"drivetrain: DistributedError: {message}\n")
        sys.stderr.flush()
        os._exit(1)
