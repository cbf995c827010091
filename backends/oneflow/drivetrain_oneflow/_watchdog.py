"""A bound on how long one rank waits for the others: oneflow 0.9's collectives have no timeout.

A peer that *dies* is noticed by oneflow itself ("Machine N lost", the process aborts)
and by the launcher, which then stops every process. A peer that is alive but stuck
(an endless loop, a dataloader that hangs, a rank-0-only callback that never returns)
would make the others wait forever. So every driver call that may wait for the other
processes runs under :meth:`Watchdog.watch`; a daemon thread checks once a second and,
when one call has lasted longer than ``timeout``, says on stderr which rank waited in
which operation and ends this process with exit code 1, which makes the launcher (or
the Trainer's supervisor) stop the rest.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator

_CHECK_EVERY = 1.0


class Watchdog:
    """Ends the process when a watched operation lasts longer than ``timeout`` seconds."""

    def __init__(self, rank: int, world_size: int, timeout: float,
                 on_expiry: Callable[[int], None] = os._exit) -> None:
        self.rank = rank
        self.world_size = world_size
        self.timeout = timeout
        self._on_expiry = on_expiry
        self._operation: str | None = None
        self._since = 0.0
        self._depth = 0
        self._thread: threading.Thread | None = None

    @contextlib.contextmanager
    def watch(self, operation: str) -> Iterator[None]:
        """Run the body as ``operation``; nested watches count as the outermost one."""
        if self._depth == 0:
            self._operation, self._since = operation, time.monotonic()
            if self._thread is None:
                self._start()
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0:
                self._operation = None

    def _start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="drivetrain-oneflow-watchdog", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            time.sleep(min(_CHECK_EVERY, self.timeout / 4))
            operation, since = self._operation, self._since
            if operation is None or time.monotonic() - since <= self.timeout:
                continue
            sys.stderr.write(
                f"drivetrain: rank {self.rank} of {self.world_size} has waited {self.timeout:g} s in {operation} for "
                "the other processes; one of them is stuck or gone (oneflow's collectives have no timeout). Ending "
                "this process so that the launcher stops the others; raise oneflow_kwargs['timeout'] if a step "
                "legitimately takes that long.\n"
            )
            sys.stderr.flush()
            self._on_expiry(1)
            return
