"""Ctrl-C on a two-process JAX run (CPU, gloo), started by the Trainer (``nproc=2``) or by ``python -m
drivetrain_jax.run --nproc_per_node 2``: both are a supervisor and two ranks, so the signal goes to the whole
process group (a terminal's Ctrl-C) or to the supervisor alone (``kill -INT``). Every rank stops within seconds with
the exception checkpoint written and the record closed (``stopped``), and ``resume_from="latest"`` then ends where an
uninterrupted run does. The phases and checks: ``tests/_ctrl_c_rule.py`` (the same for every backend); the run:
``_resume_script.py``.
"""

from __future__ import annotations

import signal

import pytest

from ... import _ctrl_c_rule as rule
from . import _resume_script
from .test_jax_processes import env as child_env

pytestmark = [pytest.mark.distributed, pytest.mark.jax]

# the two start the same supervisor (drivetrain.backend.Launcher), so the one alone to the supervisor is not doubled
CASES = [case for case in rule.cases("drivetrain_jax.run", alone="launcher") if case != ("nproc", "launcher", False)]


@pytest.mark.parametrize("launcher, target, resume", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_ctrl_c_ends_every_rank_with_the_records_closed_and_resume_is_exact(tmp_path, launcher, target,
                                                                             resume) -> None:
    launch = rule.launches(tmp_path, _resume_script.__file__, launcher, child_env,
                           lambda: ["-m", "drivetrain_jax.run", "--nproc_per_node", "2"])
    # the supervisor passes the signal on, waits for the ranks and ends by the signal itself (status 130)
    rule.interrupt_and_resume(launch, tmp_path, signal.SIGINT, target, resume=resume, launcher_code=130)
