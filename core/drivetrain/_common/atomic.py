"""Writing files so that a crash never leaves a half-written file under the real name."""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
import sys
from collections.abc import Callable, Iterator


def fsync_dir(path: str) -> None:
    """Persist a directory entry (a rename or a new file) on POSIX; a no-op where unsupported."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@functools.cache
def _sync_file_range() -> Callable[..., int] | None:
    """libc's ``sync_file_range`` on Linux (the os module does not expose it), else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_SYNC_FILE_RANGE_WRITE = 2


def start_writeback(fd: int, offset: int, length: int) -> None:
    """Ask the kernel to start writing a just-written range to disk now, without waiting.

    Why: a file written to the page cache is otherwise written out only when ``fsync``
    asks, and ``fsync`` then waits for all of it; started early, the disk works while
    the rest is written (and hashed). Only a hint: a no-op where unsupported or failing.
    """
    fn = _sync_file_range()
    if fn is not None:
        fn(fd, offset, length, _SYNC_FILE_RANGE_WRITE)


def _create_temp(directory: str, name: str) -> str:
    """An empty new file ``.<name>.<random>.tmp`` in ``directory``, created with the mode the umask leaves of 0666.

    Why not ``tempfile.mkstemp``: it creates files 0600 whatever the umask, and the rename keeps that mode, so
    a record or a model file would be unreadable to the colleague's TensorBoard, MLflow or loader that the
    umask (0644 under 022, 0640 under 027) lets read every other file the user writes.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    for _ in range(100):
        path = os.path.join(directory, f".{name}.{secrets.token_hex(4)}.tmp")
        try:
            os.close(os.open(path, flags, 0o666))
        except FileExistsError:
            continue
        return path
    raise FileExistsError(f"could not create a temporary file beside {os.path.join(directory, name)}")


@contextlib.contextmanager
def _temp_path(final_path: str) -> Iterator[str]:
    directory = os.path.dirname(os.path.abspath(final_path))
    tmp = _create_temp(directory, os.path.basename(final_path))
    try:
        yield tmp
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def atomic_write(final_path: str, write: Callable[[str], None]) -> None:
    """Call ``write(tmp_path)``, fsync the result and rename it over ``final_path``.

    If ``write`` raises, ``final_path`` keeps its previous content and the temp file is removed.
    """
    with _temp_path(final_path) as tmp:
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, final_path)
    fsync_dir(os.path.dirname(os.path.abspath(final_path)))
