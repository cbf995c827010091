"""Helpers for the distributed paddle tests: start a group of processes, and always clean it up."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from ... import _dist_helpers
from ..._dist_helpers import Finished, alive, free_ports, wait_for_file

__all__ = ["Finished", "ProcessGroup", "alive", "child_env", "free_ports", "paddle_launch", "preset_env", "spawn",
           "wait_for_file"]

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


def preset_env(rank: int, ports: list[int]) -> dict[str, str]:
    """The variables a cluster scheduler (not paddle's launcher) would give process ``rank`` of 2, on CPU."""
    endpoints = [f"127.0.0.1:{p}" for p in ports]
    return dict(child_env(), PADDLE_TRAINER_ID=str(rank), PADDLE_TRAINERS_NUM="2",
                PADDLE_TRAINER_ENDPOINTS=",".join(endpoints), PADDLE_CURRENT_ENDPOINT=endpoints[rank],
                PADDLE_DISTRI_BACKEND="gloo")


class ProcessGroup(_dist_helpers.ProcessGroup):
    """A launched command run in ``out`` (with :func:`child_env` unless ``env`` is given), killed whole at the end."""

    def __init__(self, cmd: list[str], out: Path, env: dict[str, str] | None = None, name: str = "log") -> None:
        super().__init__(cmd, out, env or child_env(), name, cwd=out)


@pytest.fixture
def launch(tmp_path):
    """``launch(cmd)`` starts ``cmd`` in ``tmp_path``; whatever is still running at the end of the test is killed."""
    yield from _dist_helpers.launching(tmp_path, ProcessGroup)
