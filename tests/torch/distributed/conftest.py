"""Helpers for the distributed torch tests: start a group of processes, and always clean it up."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from ... import _dist_helpers
from ..._dist_helpers import Finished, alive, free_port, wait_for_file

__all__ = ["Finished", "ProcessGroup", "alive", "child_env", "max_diff", "run_to_end", "spawn", "torchrun",
           "wait_for_file"]

SCRIPT = str(Path(__file__).with_name("_ddp_script.py"))


def torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
            str(free_port()), SCRIPT, *args]


def spawn(*args: str) -> list[str]:
    return [sys.executable, SCRIPT, *args]


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return env


class ProcessGroup(_dist_helpers.ProcessGroup):
    """A launched command (with :func:`child_env`) in its own session, killed whole at the end."""

    def __init__(self, cmd: list[str], out: Path) -> None:
        super().__init__(cmd, out, child_env())


def run_to_end(cmd: list[str], out: Path, timeout: float) -> Finished:
    """Run ``cmd`` (killed whole at the end, whatever happened) and require it to succeed."""
    group = ProcessGroup(cmd, out)
    try:
        done = group.wait(timeout)
    finally:
        group.close()
    assert done.returncode == 0, done.output
    return done


def max_diff(a: dict, b: dict) -> float:
    """The largest difference between two ``{name: [values]}`` parameter sets with the same names."""
    assert sorted(a) == sorted(b)
    return max(abs(x - y) for name in a for x, y in zip(a[name], b[name], strict=True))


@pytest.fixture
def launch(tmp_path):
    """``launch(cmd)`` starts ``cmd``; whatever is still running at the end of the test is killed."""
    yield from _dist_helpers.launching(tmp_path, ProcessGroup)
