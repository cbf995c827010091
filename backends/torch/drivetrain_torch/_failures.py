"""Which process failed, and why: a notice board in the process group's rendezvous store.

A collective that fails because a peer died or stopped answering says only
"connection reset" or "timed out". So a process that raises posts one line about
its own exception before it goes, the launcher of spawned processes posts the exit
code of any child that ends badly, and a peer whose collective fails reads the board
to name the rank that caused it. Every access is best effort: the board helps the
error message, it must never become a second way to hang or fail.
"""

from __future__ import annotations

import signal
import time
from typing import Any

PREFIX = "drivetrain/"
READY_KEY = PREFIX + "ready/{rank}"
"""Set by a spawned process once it reached the Trainer (the launcher waits for it)."""
EXIT_KEY = PREFIX + "exit/{rank}"
"""Set by the launcher when a process it started exits with a non-zero code."""


def exit_description(code: int) -> str:
    """``exited with code 3`` / ``was killed by SIGKILL (exit code -9)``."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name} (exit code {code})"
    return f"exited with code {code}"


def exception_summary(exc: BaseException | None) -> str:
    """One line about ``exc`` for the other processes' error messages."""
    if exc is None:
        return "failed"
    if isinstance(exc, KeyboardInterrupt):
        return "was interrupted (KeyboardInterrupt)"
    text = str(exc).strip().splitlines()
    first = text[0][:300] if text else ""
    return f"raised {type(exc).__name__}" + (f": {first}" if first else "")


class FailureBoard:
    """Failure notices of one driver's run; ``generation`` keeps a later Trainer in the same
    processes from reading an earlier one's notices."""

    def __init__(self, store: Any, rank: int, world_size: int, generation: int) -> None:
        self.store = store
        self.rank = rank
        self.world_size = world_size
        self._failed = f"{PREFIX}{generation}/failed/{{rank}}"
        self._count = f"{PREFIX}{generation}/failed_count"

    def post_failure(self, summary: str) -> None:
        try:
            self.store.set(self._failed.format(rank=self.rank), summary)
        except Exception:  # noqa: BLE001 - the store may be gone with a dead peer: the message is a nicety
            pass

    def all_failed(self, grace: float) -> bool:
        """Count this process as failed; True when every process failed within ``grace`` seconds.

        Then they all stand in the same place (an exception on every rank, Ctrl-C) and can
        still run collectives together, e.g. to save a checkpoint on the way out.
        """
        try:
            count = self.store.add(self._count, 1)
            deadline = time.monotonic() + grace
            while count < self.world_size and time.monotonic() < deadline:
                time.sleep(0.05)
                count = self.store.add(self._count, 0)
        except Exception:  # noqa: BLE001
            return False
        return count >= self.world_size

    def reports(self, wait: float = 0.0) -> dict[int, str]:
        """``{rank: what happened}`` for every other process that posted, polling up to ``wait`` seconds."""
        deadline = time.monotonic() + wait
        while True:
            found = self._read()
            if found or time.monotonic() >= deadline:
                return found
            time.sleep(0.1)

    def _read(self) -> dict[int, str]:
        found: dict[int, str] = {}
        try:
            for rank in range(self.world_size):
                if rank == self.rank:
                    continue
                parts = [self._get(key.format(rank=rank)) for key in (self._failed, EXIT_KEY)]
                parts = [p for p in parts if p]
                if parts:
                    found[rank] = "; ".join(parts)
        except Exception:  # noqa: BLE001 - e.g. the store was hosted by the process that died
            return found
        return found

    def _get(self, key: str) -> str | None:
        if not self.store.check([key]):  # check does not block; get would wait for a missing key
            return None
        return self.store.get(key).decode("utf-8", "replace")
