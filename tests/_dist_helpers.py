"""Helpers for the multi-process tests of every backend: start a command in its own session, wait for it
with a timeout, always kill whatever it started, and list the TCP ports its processes listen on."""

from __future__ import annotations

import ipaddress
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
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
                 cwd: Path | None = None, interruptible: bool = False) -> None:
        self.log = out / f"{name}.txt"
        self._log = open(self.log, "wb")  # noqa: SIM115 - closed in close()
        self.started = time.monotonic()
        # interruptible: SIGINT at its default in the child, whatever this process inherited (see tests/_signals.py)
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True, cwd=cwd,
                                     preexec_fn=_default_sigint if interruptible else None)  # noqa: PLW1509

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


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def stop_when_ready(group: ProcessGroup, signum: int, target: str, timeout: float,
                    logs: Callable[[], str] | None = None) -> Finished:
    """Wait until the run prints ``ready <pid of rank 0>``, send ``signum`` to ``target`` and wait for the end.

    ``target``: ``"group"`` (the whole process group, as a terminal's Ctrl-C does), ``"launcher"`` (the
    process the test started) or ``"rank0"`` (the pid the run printed). ``logs`` reads what rank 0 printed
    when the launcher keeps it apart (default: the group's output). ``seconds`` of the result counts from
    the signal to the end of the last process of the group's session.
    """
    deadline = time.monotonic() + timeout
    found = None
    while found is None:
        found = re.search(r"^ready (\d+)$", (logs or group.output)(), re.MULTILINE)
        if found is None and (group.proc.poll() is not None or time.monotonic() > deadline):
            group.close()
            pytest.fail(f"the run did not get ready (exit {group.proc.returncode}):\n{group.output()}")
        time.sleep(0.05)
    sent = time.monotonic()
    if target == "group":
        os.killpg(group.proc.pid, signum)
    else:
        os.kill(group.proc.pid if target == "launcher" else int(found.group(1)), signum)
    code = group.wait(timeout).returncode
    while session_pids(group.proc.pid):  # every process it started, not only the one the test started
        if time.monotonic() - sent > timeout:
            pytest.fail(f"processes {session_pids(group.proc.pid)} still run {timeout} s after the signal")
        time.sleep(0.05)
    return Finished(code, group.output(), time.monotonic() - sent)


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
    except OSError:  # gone before the open (ENOENT), or reaped between the open and the read (ESRCH)
        return False


def wait_for_file(path: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            pytest.fail(f"{path} did not appear within {timeout} s")
        time.sleep(0.05)


# ------------------------------------------------------------------ listening sockets
_LISTEN = "0A"  # the TCP state LISTEN in /proc/net/tcp
_LOOPBACK = (ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128"))


@dataclass(frozen=True)
class Listener:
    """A TCP socket in LISTEN state that process ``pid`` holds."""

    pid: int
    address: ipaddress.IPv4Address | ipaddress.IPv6Address
    port: int

    @property
    def loopback(self) -> bool:
        """Reachable from this machine only (127.0.0.0/8, ::1, or ::ffff:127.x.x.x)."""
        address = getattr(self.address, "ipv4_mapped", None) or self.address
        return any(address in net for net in _LOOPBACK)

    def __str__(self) -> str:
        host = f"[{self.address}]" if self.address.version == 6 else str(self.address)
        return f"{host}:{self.port} (pid {self.pid})"


def session_pids(leader: int) -> list[int]:
    """The processes of the session ``leader`` started (``start_new_session=True``): a run and all it spawned."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
        except (OSError, IndexError):
            continue
        if int(fields[3]) == leader:  # pid (comm) state ppid pgrp session: the session is the 4th after comm
            pids.append(int(entry))
    return sorted(pids)


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return inodes
    for fd in fds:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[len("socket:["):-1])
    return inodes


def _address(hex_address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """An address of /proc/net/tcp{,6}: 32-bit words in host (little-endian) byte order."""
    raw = bytes.fromhex(hex_address)
    return ipaddress.ip_address(b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4)))


def listeners(pids: Iterable[int]) -> list[Listener]:
    """Every TCP socket in LISTEN state (IPv4 and IPv6) held by one of ``pids`` (Linux ``/proc``)."""
    found = []
    for pid in pids:
        inodes = _socket_inodes(pid)
        for table in ("tcp", "tcp6"):
            try:
                with open(f"/proc/{pid}/net/{table}") as f:
                    rows = f.read().splitlines()[1:]
            except OSError:
                continue
            for row in rows:
                fields = row.split()
                if fields[3] == _LISTEN and fields[9] in inodes:
                    host, port = fields[1].split(":")
                    found.append(Listener(pid, _address(host), int(port, 16)))
    return found


def process_env(pid: int) -> dict[str, str]:
    """The environment process ``pid`` started with."""
    with open(f"/proc/{pid}/environ", "rb") as f:
        pairs = [item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item]
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def assert_loopback_only(leader: int, allowed: Mapping[int, str] | None = None) -> list[Listener]:
    """Fail when a process of the session ``leader`` listens beyond loopback, except on the ports of
    ``allowed`` (``{port: why}``: a framework's own server that binds every interface); return what it listens on."""
    heard = listeners(session_pids(leader))
    exposed = [str(s) for s in heard if not s.loopback and s.port not in (allowed or {})]
    assert not exposed, f"listening beyond loopback: {exposed} (all: {[str(s) for s in heard]})"
    return heard
