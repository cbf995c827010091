"""paddle's ``TCPStore`` as the store of the core's failure board and launcher.

paddle's store differs from what :mod:`drivetrain.backend` expects in two ways, both
handled here: ``get`` waits for a missing key and there is no ``check`` (the core's
:class:`~drivetrain.backend.CheckedStore` adds one), and a store handle is one TCP
connection, not meant to be shared between threads. So :class:`ThreadStore` gives each
thread its own connection. Connecting to a store whose process died retries forever,
while a connection made before fails at once; so a thread connects to another process's
store only through :meth:`ThreadStore.connect_here`, called while every process is alive,
and a thread that did not is refused (the board then just names no rank).
"""

from __future__ import annotations

import threading
from typing import Any

_CONNECT_TIMEOUT = 10  # seconds


def host_store(host: str, port: int, timeout: float) -> Any:
    """Host a store on ``port`` (a server nobody else waits for: world size 1) and return its handle."""
    from paddle.base import core

    return core.TCPStore(host, port, True, 1, int(timeout))


class ThreadStore:
    """The store at ``address`` through one connection per thread; ``hosted`` is this process's own server."""

    def __init__(self, address: tuple[str, int], hosted: Any = None) -> None:
        self.address = address
        self._hosted = hosted  # keeps the server alive, and is the creating thread's connection
        self._local = threading.local()
        if hosted is not None:
            self._local.conn = hosted

    def connect_here(self) -> None:
        """Open the calling thread's connection now (best effort)."""
        if getattr(self._local, "conn", None) is None:
            try:
                self._local.conn = _connect(self.address)
            except Exception:  # noqa: BLE001 - without it, errors just name no rank
                self._local.conn = None

    def _conn(self) -> Any:
        conn = getattr(self._local, "conn", None)
        if conn is None and self._hosted is not None:  # this process's own server cannot be gone
            self.connect_here()
            conn = self._local.conn
        if conn is None:
            raise ConnectionError(f"this thread has no connection to the store at {self.address}")
        return conn

    def set(self, key: str, value: str) -> None:
        self._conn().set(key, value)

    def get(self, key: str) -> bytes:
        return bytes(self._conn().get(key))

    def add(self, key: str, amount: int) -> int:
        return int(self._conn().add(key, amount))


def _connect(address: tuple[str, int]) -> Any:
    from paddle.base import core

    return core.TCPStore(address[0], address[1], False, 1, _CONNECT_TIMEOUT)
