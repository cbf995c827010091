"""The resume rule at another world size under ``mpirun`` (jittor's MPI driver, CPU): 2 processes train
2 epochs, then 3 resume. jittor's ``batch_size`` is the global batch under MPI; the script keeps 2 samples
per process (4 at 2 processes, 6 at 3), so an epoch takes 13 steps at 2 processes and 9 at 3. The tests
and the phases the processes run: ``tests/paddle/distributed/_resume_rule.py`` (framework-free); two
mpiruns (2 processes: ``first``; 3: ``finished``, then ``more``), each bounded in time.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from .. import _resume_rule as rule
from .._dist_helpers import ProcessGroup
from . import _resume_script

MPIRUN = shutil.which("mpirun")
LIMIT = 180  # seconds for one mpirun (warm jittor cache: a few seconds)

pytestmark = [
    pytest.mark.jittor,
    pytest.mark.distributed,
    pytest.mark.timeout(2 * LIMIT + 30),
    pytest.mark.skipif(MPIRUN is None, reason="mpirun not found (apt-get install openmpi-bin libopenmpi-dev)"),
]


def _mpirun(out: Path, world: int, phases: str) -> str:
    """mpirun's output holds every process's, rank 0's among them."""
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1",
               PYTHONUNBUFFERED="1")
    command = [MPIRUN, "-np", str(world), "--oversubscribe", sys.executable, _resume_script.__file__, str(out), phases]
    return rule.finish(ProcessGroup(command, out, env, name=f"mpirun-{world}"), LIMIT, f"mpirun -np {world}, {phases}")


@pytest.fixture(scope="module")
def resumed(tmp_path_factory) -> rule.Resumed:
    return rule.launch_both(tmp_path_factory.mktemp("resume-world-sizes"), _mpirun, _resume_script.PER_RANK)


class TestMpirun(rule.ResumeAtAnotherWorldSize):
    script, index_key, per_rank = _resume_script, "index", _resume_script.PER_RANK
