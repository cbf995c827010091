"""The resume rule at another world size with oneflow's launcher (CPU): 2 ranks train 2 epochs (7 steps
each), then 3 ranks resume (5 steps an epoch). The tests and the phases the processes run:
``tests/paddle/distributed/_resume_rule.py`` (framework-free); two launches (2 ranks: ``first``;
3 ranks: ``finished``, then ``more``), each bounded in time.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ... import _resume_rule as rule
from . import _resume_script
from .conftest import ProcessGroup, free_port

TIMEOUT = 150  # for one launch; the processes themselves finish in seconds

pytestmark = [pytest.mark.distributed, pytest.mark.oneflow, pytest.mark.timeout(2 * TIMEOUT + 30)]


def _launch(out: Path, world: int, phases: str) -> str:
    """Every rank writes to the launcher's output, rank 0 among them."""
    (out / f"launch-{world}").mkdir()
    group = ProcessGroup([sys.executable, "-m", "oneflow.distributed.launch", "--nproc_per_node", str(world),
                          "--master_port", str(free_port()), _resume_script.__file__, str(out), phases],
                         out / f"launch-{world}")
    return rule.finish(group, TIMEOUT, f"oneflow launcher, {world} ranks, {phases}")


@pytest.fixture(scope="module")
def resumed(tmp_path_factory) -> rule.Resumed:
    return rule.launch_both(tmp_path_factory.mktemp("resume-world-sizes"), _launch)


class TestOneflowLauncher(rule.ResumeAtAnotherWorldSize):
    script, index_key = _resume_script, "idx"
