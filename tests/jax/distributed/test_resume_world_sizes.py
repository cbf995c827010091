"""The resume rule at another world size with drivetrain_jax's launcher (CPU, gloo): 2 processes train 2 epochs
(7 steps each), then 3 resume (5 steps an epoch), and the 3-process end resumes in this one process. The tests and
the phases the processes run: ``tests/_resume_rule.py`` (framework-free, the same for every backend); two launches,
each bounded in time.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ... import _resume_rule as rule
from ..._dist_helpers import ProcessGroup
from . import _resume_script
from .test_jax_processes import env

TIMEOUT = 150  # for one launch; the processes themselves finish in seconds

pytestmark = [pytest.mark.distributed, pytest.mark.jax, pytest.mark.timeout(2 * TIMEOUT + 60)]


def _launch(out: Path, world: int, phases: str) -> str:
    """Every process writes to the launcher's output, rank 0 among them."""
    command = [sys.executable, "-m", "drivetrain_jax.run", "--nproc_per_node", str(world), _resume_script.__file__,
               str(out), phases]
    return rule.finish(ProcessGroup(command, out, env(), name=f"launch-{world}", cwd=out), TIMEOUT,
                       f"drivetrain_jax.run, {world} processes, {phases}")


@pytest.fixture(scope="module")
def resumed(tmp_path_factory) -> rule.Resumed:
    return rule.launch_both(tmp_path_factory.mktemp("resume-world-sizes"), _launch)


class TestJaxLauncher(rule.ResumeAtAnotherWorldSize):
    script, index_key = _resume_script, "idx"
