"""One run per checkpoint folder: a lock that the operating system releases when its run ends, however it ends.

Two runs saving into one folder (the same script in a second terminal, a requeued job whose first instance
still runs) would interleave their checkpoints and tidy each other's half-written saves away. The run that
trains takes an exclusive ``flock`` on ``.drivetrain-run.lock`` in the folder and writes who it is (host,
pid, start time); a second run finds the lock held and refuses, naming the first. The kernel drops the lock
when the holder's process ends, even by ``kill -9``; the file then still names the killed run, so the next
run takes the lock over and says so. A run that ends normally removes the file (a run that opened it just
before finds, once it holds the lock, that the name leads to another file or none, and tries again).
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import socket
from typing import Any

from .folder import CheckpointError

LOCK_NAME = ".drivetrain-run.lock"


def _describe(holder: dict[str, Any]) -> str:
    return (f"host {holder.get('host', '?')}, pid {holder.get('pid', '?')}, started "
            f"{holder.get('started', '?')}")


class FolderLock:
    """The lock of the checkpoint folder ``folder`` (created if missing)."""

    def __init__(self, folder: str) -> None:
        self.folder = os.path.abspath(folder)
        self.path = os.path.join(self.folder, LOCK_NAME)
        self._fd: int | None = None

    def acquire(self) -> str | None:
        """Take the lock; returns a line about the run whose lock was taken over (it ended without releasing
        it), or None.

        Raises:
            CheckpointError: another live process holds the lock; the message names it.
        """
        os.makedirs(self.folder, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                holder = _read(fd)
                os.close(fd)
                raise CheckpointError(
                    f"{self.folder} is in use by another run ({_describe(holder)}): two runs saving into one "
                    "folder would interleave their checkpoints. Stop that run first, or give this one another "
                    "folder (CheckpointCallback(folder=...)).") from None
            if _same_file(fd, self.path):
                break
            os.close(fd)  # the holder removed the file between our open and our lock: lock the current one
        previous = _read(fd)
        mine = {"host": socket.gethostname(), "pid": os.getpid(),
                "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(mine).encode(), 0)
        os.fsync(fd)
        self._fd = fd
        if previous:
            return (f"{self.folder}: taking over the lock of a run that ended without releasing it "
                    f"({_describe(previous)}).")
        return None

    def release(self) -> None:
        """Remove the file (a clean end) and drop the lock."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        with contextlib.suppress(OSError):
            os.remove(self.path)
        os.close(fd)  # closing the descriptor drops the flock


def _same_file(fd: int, path: str) -> bool:
    try:
        named = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (named.st_dev, named.st_ino)


def _read(fd: int) -> dict[str, Any]:
    try:
        data = os.pread(fd, 4096, 0)
        holder = json.loads(data) if data.strip() else {}
    except (OSError, ValueError):
        return {"host": "?", "pid": "?", "started": "? (the lock file is not readable)"}
    return holder if isinstance(holder, dict) else {}
