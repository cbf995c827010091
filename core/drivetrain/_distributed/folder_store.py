"""A key-value store in a private folder: notices between the processes of one machine, with no socket.

The processes a Trainer starts tell their parent that they reached the Trainer and post
their failures through a store (:class:`drivetrain.backend.FailureBoard`). A framework's
own store is a TCP server, and some (paddle's) listen on every interface whatever host they
are given; a run that lives on one machine needs no port for that. This store is a folder
only its owner may enter (``mkdtemp``: mode 0700): one file per key, written whole and renamed
into place, counters changed under a file lock. It has the methods the board and the
launcher use (``set``, ``get``, ``add``, ``check``); a dead process cannot take it away.

The launcher removes the folder at exit; a first process that could not (killed, or ended by
``os._exit``) leaves it behind, and the next run on the machine removes it (its name holds
the pid of the process that made it).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator

if sys.platform == "win32":  # byte-range locks instead of flock
    import msvcrt
else:
    import fcntl

FOLDER_PREFIX = "drivetrain-run-"
_POLL = 0.02


class FolderStore:
    """The store in ``folder`` (made by :meth:`create` in the process that starts the others; the others open
    the same path). ``timeout``: how long :meth:`get` waits for a key nobody set."""

    def __init__(self, folder: str, timeout: float = 300.0) -> None:
        if not os.path.isdir(folder):
            raise FileNotFoundError(f"the store folder {folder!r} does not exist (the process that made it ended, "
                                    "or the path was not made by FolderStore.create)")
        self.folder = folder
        self.timeout = timeout

    @classmethod
    def create(cls, timeout: float = 300.0) -> FolderStore:
        """A store in a new private temporary folder (remove it with :meth:`remove`), after removing the
        folders earlier runs' processes left when they died."""
        _remove_orphans(tempfile.gettempdir())
        return cls(tempfile.mkdtemp(prefix=f"{FOLDER_PREFIX}{os.getpid()}-"), timeout)

    def remove(self) -> None:
        """Delete the folder and everything in it (best effort: nothing to do once it is gone)."""
        shutil.rmtree(self.folder, ignore_errors=True)

    def connect_here(self) -> None:
        """Nothing to do: a folder needs no connection per thread (the method :class:`ThreadStore` has)."""

    def _path(self, key: str) -> str:
        """One flat folder, any key: its hex, or its hash where the hex would be too long a file name."""
        name = key.encode().hex()
        return os.path.join(self.folder, name if len(name) <= 200 else hashlib.sha256(key.encode()).hexdigest())

    def set(self, key: str, value: str | bytes) -> None:
        """Store ``value`` under ``key``: readers see the old value or the new one, never half of it."""
        data = value.encode() if isinstance(value, str) else value
        path = self._path(key)
        partial = f"{path}.{os.getpid()}.{threading.get_ident()}.partial"
        with open(partial, "wb") as f:
            f.write(data)
        os.replace(partial, path)

    def get(self, key: str) -> bytes:
        """The bytes under ``key``, waiting up to ``timeout`` seconds for some process to set it."""
        path = self._path(key)
        deadline = time.monotonic() + self.timeout
        while True:
            with contextlib.suppress(FileNotFoundError), open(path, "rb") as f:
                return f.read()
            if time.monotonic() > deadline:
                raise TimeoutError(f"no process set {key!r} in the store {self.folder} within {self.timeout:g} s")
            time.sleep(_POLL)

    def add(self, key: str, amount: int) -> int:
        """Add ``amount`` to the counter ``key`` (0 when new) and return its new value (``amount=0`` reads it)."""
        path = self._path(key)
        with _locked(path + ".lock"):
            try:
                with open(path, "rb") as f:
                    value = int(f.read() or b"0")
            except FileNotFoundError:
                value = 0
            if amount:
                value += amount
                self.set(key, str(value))
            return value

    def check(self, keys: list[str]) -> bool:
        """Whether every key of ``keys`` was set (or added to), without waiting."""
        return all(os.path.exists(self._path(key)) for key in keys)


def _remove_orphans(parent: str) -> None:
    """Delete the store folders in ``parent`` whose maker is no longer running (POSIX: there signal 0
    asks whether a pid runs; on Windows ``os.kill`` would end the process instead)."""
    if os.name != "posix":
        return
    with contextlib.suppress(OSError):
        for name in os.listdir(parent):
            pid = name[len(FOLDER_PREFIX):].split("-", 1)[0] if name.startswith(FOLDER_PREFIX) else ""
            if not pid.isdigit():
                continue
            try:
                os.kill(int(pid), 0)
            except ProcessLookupError:
                shutil.rmtree(os.path.join(parent, name), ignore_errors=True)
            except OSError:  # running, as another user: theirs
                continue


@contextlib.contextmanager
def _locked(path: str) -> Iterator[None]:
    """Hold an exclusive lock on the file ``path`` (made if missing); the system drops it if this process dies."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        if sys.platform == "win32":
            msvcrt.locking(fd, msvcrt.LK_LOCK, 1)
            try:
                yield
            finally:
                msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)
        else:
            fcntl.flock(fd, fcntl.LOCK_EX)  # closing the file releases it
            yield
    finally:
        os.close(fd)
