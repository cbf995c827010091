"""Helpers for the distributed paddle tests: start a group of processes, and always clean it up."""

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

SCRIPT = str(Path(__file__).with_name("_dist_script.py"))
_LAUNCH_VARS = ("PADDLE_", "FLAGS_selected_gpus", "MASTER_ADDR", "MASTER_PORT", "DRIVETRAIN_SPAWN_")


def paddle_launch(log_dir: Path, *args: str) -> list[str]:
    """paddle's own launcher, its logs (and the environment dump it writes) kept out of the working directory."""
    return [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", "2", "--log_dir", str(log_dir),
            SCRIPT, *args]


def spawn(*args: str) -> list[str]:
    return [sys.executable, SCRIPT, *args]


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_LAUNCH_VARS)}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", GLOG_minloglevel="2")
    return env


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def preset_env(rank: int, ports: list[int]) -> dict[str, str]:
    """The variables a cluster scheduler (not paddle's launcher) would give process ``rank`` of 2, on CPU."""
    endpoints = [f"127.0.0.1:{p}" for p in ports]
    return dict(child_env(), PADDLE_TRAINER_ID=str(rank), PADDLE_TRAINERS_NUM="2",
                PADDLE_TRAINER_ENDPOINTS=",".join(endpoints), PADDLE_CURRENT_ENDPOINT=endpoints[rank],
                PADDLE_DISTRI_BACKEND="gloo")


@dataclass
class Finished:
    returncode: int
    output: str
    seconds: float


class ProcessGroup:
    """A launched command in its own session, so that every process it starts can be killed at the end."""

    def __init__(self, cmd: list[str], out: Path, env: dict[str, str] | None = None, name: str = "log") -> None:
        self.log = out / f"{name}.txt"
        self._log = open(self.log, "wb")  # noqa: SIM115 - closed in close()
        self.started = time.monotonic()
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env or child_env(),
                                     start_new_session=True, cwd=out)

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
    """``launch(cmd)`` starts ``cmd`` in ``tmp_path``; whatever is still running at the end of the test is killed."""
    groups: list[ProcessGroup] = []

    def start(cmd: list[str], out: Path | None = None, env: dict[str, str] | None = None,
              name: str = "log") -> ProcessGroup:
        group = ProcessGroup(cmd, out or tmp_path, env, name)
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
