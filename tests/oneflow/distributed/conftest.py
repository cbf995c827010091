"""Helpers for the distributed oneflow tests: start a group of processes, and always clean it up."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

SCRIPT = str(Path(__file__).with_name("_ddp_script.py"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def oneflow_launch(*args: str) -> list[str]:
    return [sys.executable, "-m", "oneflow.distributed.launch", "--nproc_per_node", "2", "--master_port",
            str(free_port()), SCRIPT, *args]


def self_launch(*args: str) -> list[str]:
    return [sys.executable, SCRIPT, *args, "--nproc", "2"]


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", GLOG_minloglevel="2")
    return env


@dataclass
class Finished:
    returncode: int
    output: str
    seconds: float


class ProcessGroup:
    """A launched command in its own session, so that every process it starts can be killed at the end."""

    def __init__(self, cmd: list[str], out: Path) -> None:
        self.log = out / "log.txt"
        self._log = open(self.log, "wb")  # noqa: SIM115 - closed in close()
        self.started = time.monotonic()
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=child_env(),
                                     start_new_session=True)

    def wait(self, timeout: float) -> Finished:
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.close()
            pytest.fail(f"the processes did not finish within {timeout} s:\n{self.output()}")
        return Finished(code, self.output(), time.monotonic() - self.started)

    def output(self) -> str:
        self._log.flush()
        return self.log.read_text(errors="replace")

    def close(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except OSError:
            pass
        self.proc.wait()
        self._log.close()


@pytest.fixture
def launch(tmp_path):
    """``launch(cmd)`` starts ``cmd``; whatever is still running at the end of the test is killed."""
    groups: list[ProcessGroup] = []

    def start(cmd: list[str], out: Path | None = None) -> ProcessGroup:
        group = ProcessGroup(cmd, out or tmp_path)
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
