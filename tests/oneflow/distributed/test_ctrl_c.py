"""Ctrl-C on a two-process oneflow run (CPU), started by the Trainer (``nproc=2``: a supervisor and two ranks)
or by ``oneflow.distributed.launch``: every rank stops within seconds with the exception checkpoint written
and the record closed (``stopped``), and ``resume_from="latest"`` then ends where an uninterrupted run does.
The phases and checks: ``tests/_ctrl_c_rule.py`` (the same for every backend); the run: ``_resume_script.py``.
"""

from __future__ import annotations

import signal

import pytest

from ... import _ctrl_c_rule as rule
from ..._dist_helpers import free_port
from . import _resume_script
from .conftest import child_env

pytestmark = [pytest.mark.distributed, pytest.mark.oneflow]

CASES = rule.cases("oneflow.distributed.launch", alone="launcher")  # nproc: the script's process only supervises


@pytest.mark.parametrize("launcher, target, resume", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_ctrl_c_ends_every_rank_with_the_records_closed_and_resume_is_exact(tmp_path, launcher, target,
                                                                             resume) -> None:
    launch = rule.launches(tmp_path, _resume_script.__file__, launcher, child_env, lambda: [
        "-m", "oneflow.distributed.launch", "--nproc_per_node", "2", "--master_port", str(free_port())])
    # the Trainer's supervisor exits with status 130; oneflow's launcher SIGTERMs its process group and exits with 1
    # at once (the workers still stop as on Ctrl-C: they get SIGTERM when it exits)
    rule.interrupt_and_resume(launch, tmp_path, signal.SIGINT, target, resume=resume,
                              launcher_code=130 if launcher == "nproc" else 1)
