"""jittor under a real one-host Slurm (tests/_slurm.py): ``srun --mpi=pmix -n 2 python train.py`` is one MPI run of
two ranks, the same as ``mpirun -np 2`` run in the batch script of an ``sbatch -n 2`` job (parameters, the
collectives' answers, evaluation); ``srun -n 2`` without PMIx is refused naming those two lines. jittor joins MPI
when it is imported, only where ``mpirun``'s variables are set: each task of srun runs its program again in its
place with them, taken from Slurm's."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from tests import _slurm

from .test_jittor_mpi import MPIRUN, SCRIPT, params, records

slurm_cluster = _slurm.slurm_cluster
ROOT = Path(__file__).resolve().parents[2]  # the working folder of the jobs: the suite's PYTHONPATH may be relative

pytestmark = [
    pytest.mark.jittor,
    pytest.mark.distributed,
    pytest.mark.timeout(300),
    pytest.mark.skipif(MPIRUN is None, reason="mpirun not found (apt-get install openmpi-bin libopenmpi-dev)"),
]


def test_srun_mpi_pmix_n2_equals_mpirun_in_the_batch_script_and_without_pmix_is_refused(slurm_cluster, tmp_path) -> None:
    if not slurm_cluster.pmix:
        pytest.skip("Slurm's mpi/pmix plugin has no libpmix here (apt-get install libpmix-dev before the cluster starts)")
    launched, srun = tmp_path / "mpirun", tmp_path / "srun"
    launched.mkdir()
    srun.mkdir()
    job = slurm_cluster.sbatch(f"mpirun --allow-run-as-root -np 2 {sys.executable} {SCRIPT} train {launched}", "-n",
                               "2", env={"OMP_NUM_THREADS": "1"}, cwd=ROOT)
    slurm_cluster.wait_job(job, "COMPLETED", timeout=240)
    done = slurm_cluster.run(["srun", "--mpi=pmix", "-n", "2", sys.executable, SCRIPT, "train", str(srun)],
                             env={"OMP_NUM_THREADS": "1"}, timeout=240, check=False, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "tasks of this Slurm step join one run: each runs its program again" in done.stderr
    for expected, got in zip(records(launched), records(srun), strict=True):
        assert got == expected
    for rank in (0, 1):
        expected_params, got_params = params(launched, rank), params(srun, rank)
        assert sorted(got_params) == sorted(expected_params)
        for name in expected_params:
            np.testing.assert_array_equal(got_params[name], expected_params[name], err_msg=name)

    refused = tmp_path / "refused"
    refused.mkdir()
    done = slurm_cluster.run(["srun", "-n", "2", sys.executable, SCRIPT, "train", str(refused)],
                             env={"OMP_NUM_THREADS": "1"}, timeout=240, check=False, cwd=ROOT)
    assert done.returncode != 0 and "started without PMIx" in done.stderr, done.stderr[-3000:]
    assert "srun --mpi=pmix -n 2 python your_script.py" in done.stderr
    assert not list(refused.iterdir())

