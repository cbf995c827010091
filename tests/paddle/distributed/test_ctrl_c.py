"""Ctrl-C on a two-process paddle run (CPU, gloo), started by the Trainer (``nproc=2``) or by
``paddle.distributed.launch``: every rank stops within seconds with the exception checkpoint written and
the record closed (``stopped``), and ``resume_from="latest"`` then ends where an uninterrupted run does.
The phases and checks: ``tests/_ctrl_c_rule.py`` (the same for every backend); the run: ``_resume_script.py``.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

from ... import _ctrl_c_rule as rule
from ..._dist_helpers import ProcessGroup
from . import _resume_script
from .conftest import child_env

pytestmark = [pytest.mark.distributed, pytest.mark.paddle]

CASES = rule.cases("paddle.distributed.launch")


@pytest.mark.parametrize("launcher, target, resume", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_ctrl_c_ends_every_rank_with_the_records_closed_and_resume_is_exact(tmp_path, launcher, target,
                                                                             resume) -> None:
    launches = iter(range(2))
    logs: list[Path] = []

    def launch(phases: str) -> ProcessGroup:
        name = f"launch-{next(launches)}"
        env = child_env()
        if launcher == "nproc":
            env[rule.NPROC_ENV] = "2"
            return ProcessGroup([sys.executable, _resume_script.__file__, str(tmp_path), phases], tmp_path, env,
                                name, cwd=tmp_path, interruptible=True)
        logs.append(tmp_path / f"{name}-logs")
        return ProcessGroup([sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", "2", "--log_dir",
                             str(logs[-1]), _resume_script.__file__, str(tmp_path), phases], tmp_path, env, name,
                            cwd=tmp_path, interruptible=True)

    def workers() -> str:
        return "".join(p.read_text(errors="replace") for p in sorted(logs[-1].glob("workerlog.*")))

    if launcher == "nproc":
        rule.interrupt_and_resume(launch, tmp_path, signal.SIGINT, target, resume=resume)
    else:  # paddle's launcher stops its workers (in their own sessions) with SIGTERM and exits with status 2
        rule.interrupt_and_resume(launch, tmp_path, signal.SIGINT, target, resume=resume, launcher_code=2,
                                  logs=workers)
