"""Writing files so that a crash never leaves a half-written file under the real name."""

from __future__ import annotations

import contextlib
import os
import tempfile
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


@contextlib.contextmanager
def _temp_path(final_path: str) -> Iterator[str]:
    directory = os.path.dirname(os.path.abspath(final_path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(final_path)}.", suffix=".tmp", dir=directory)
    os.close(fd)
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
