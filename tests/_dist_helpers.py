"""Helpers for the multi-process tests of every backend: start a command in its own session, wait for it
with a timeout, and always kill whatever it started."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports free right now (all held open together, so no two are the same)."""
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def free_port() -> int:
    return free_ports(1)[0]


@dataclass
class Finished:
    returncode: int
    output: str
    seconds: float


class ProcessGroup:
    """A launched command in its own session, so that every process it starts can be killed at the end.

    Its output goes to ``out/<name>.txt``; ``cwd`` is where it runs (None: here).
    """

    def __init__(self, cmd: list[str], out: Path, env: dict[str, str], name: str = "log",
                 cwd: Path | None = None) -> None:
        self.log = out / f"{name}.txt"
        self._log = open(self.log, "wb")  # noqa: SIM115 - closed in close()
        self.started = time.monotonic()
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True, cwd=cwd)

    def wait(self, timeout: float) -> Finished:
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.close()
            pytest.fail(f"the processes did not finish within {timeout} s:\n{self.output()}")
        return Finished(code, self.output(), time.monotonic() - self.started)

    def output(self) -> str:
        if not self._log.closed:  # closed after a timeout killed the group: what was written is on disk
            self._log.flush()
        return self.log.read_text(errors="replace")

    def close(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except OSError:
            pass
        self.proc.wait()
        self._log.close()


def launching(tmp_path: Path, make: Callable[..., ProcessGroup]) -> Iterator[Callable[..., ProcessGroup]]:
    """The body of a ``launch`` fixture: ``launch(cmd, out=None, ...)`` starts ``make(cmd, out or tmp_path, ...)``;
    whatever is still running at the end of the test is killed."""
    groups: list[ProcessGroup] = []

    def start(cmd: list[str], out: Path | None = None, *args: object, **kwargs: object) -> ProcessGroup:
        group = make(cmd, out or tmp_path, *args, **kwargs)
        groups.append(group)
        return group

    yield start
    for group in groups:
        group.close()


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie waiting to be reaped counts as gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return not any(line.startswith("State:") and "Z" in line.split()[1] for line in f)
    except FileNotFoundError:
        return False


def wait_for_file(path: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            pytest.fail(f"{path} did not appear within {timeout} s")
        time.sleep(0.05)
