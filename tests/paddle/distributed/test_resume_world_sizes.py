"""The resume rule at another world size with paddle's launcher (gloo on CPU): 2 ranks train 2 epochs
(7 steps each), then 3 ranks resume (5 steps an epoch). The tests and the phases the processes run:
``_resume_rule.py``; two launches (2 ranks: ``first``; 3 ranks: ``finished``, then ``more``), each
bounded in time, their logs in the test's temporary folder.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ... import _resume_rule as rule
from . import _resume_script
from .conftest import ProcessGroup

TIMEOUT = 120  # for one launch; the processes themselves finish in seconds

pytestmark = [pytest.mark.distributed, pytest.mark.paddle, pytest.mark.timeout(2 * TIMEOUT + 30)]


def _launch(out: Path, world: int, phases: str) -> str:
    logs = out / f"paddle-logs-{world}"
    group = ProcessGroup([sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", str(world),
                          "--log_dir", str(logs), _resume_script.__file__, str(out), phases], out,
                         name=f"launch-{world}")

    def workers() -> str:
        return "".join(p.read_text(errors="replace") for p in sorted(logs.glob("workerlog.*")))

    rule.finish(group, TIMEOUT, f"paddle launcher, {world} ranks, {phases}", workers)
    return (logs / "workerlog.0").read_text(errors="replace")


@pytest.fixture(scope="module")
def resumed(tmp_path_factory) -> rule.Resumed:
    return rule.launch_both(tmp_path_factory.mktemp("resume-world-sizes"), _launch)


class TestPaddleLauncher(rule.ResumeAtAnotherWorldSize):
    script, index_key = _resume_script, "idx"
