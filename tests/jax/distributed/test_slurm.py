"""JAX under a real one-host Slurm (tests/_slurm.py): ``srun -n 2 python train.py`` with ``driver="jax"`` is one run
of two ranks, the parameters bit-identical to the Trainer's own ``nproc=2``. Each task has used JAX alone (it built
the model) before the Trainer, so it runs its program again in its place (same pid) under ``drivetrain_jax.run``,
which joins the tasks with ``jax.distributed.initialize`` (the coordinator on the step's first node, at the port
derived from the job id)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests import _slurm

SCRIPT = Path(__file__).with_name("_slurm_script.py")
slurm_cluster = _slurm.slurm_cluster

pytestmark = [pytest.mark.distributed, pytest.mark.jax, pytest.mark.timeout(300)]
ENV = {"JAX_PLATFORMS": "cpu", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def test_srun_n2_is_one_run_equal_to_nproc_2(slurm_cluster, tmp_path) -> None:
    spawned, srun = tmp_path / "nproc", tmp_path / "srun"
    spawned.mkdir()
    srun.mkdir()
    launch = ("SLURM_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(launch)}, **ENV}
    subprocess.run([sys.executable, str(SCRIPT), str(spawned), "--nproc", "2"], check=True, timeout=180, env=env,
                   cwd=tmp_path)
    done = slurm_cluster.run(["srun", "-n", "2", sys.executable, str(SCRIPT), str(srun)], timeout=180, env=ENV,
                             cwd=tmp_path)
    ranks = [json.loads((srun / f"rank-{r}.json").read_text()) for r in (0, 1)]
    assert [(r["rank"], r["world_size"]) for r in ranks] == [(0, 2), (1, 2)], done.stderr[-3000:]
    began = (srun / "began.txt").read_text().split()
    assert sorted(began) == sorted([str(r["pid"]) for r in ranks] * 2), began  # each task, twice, in its process
    assert "tasks of this Slurm step join one run: each runs its program again" in done.stderr
    expected, got = np.load(spawned / "final.npz"), np.load(srun / "final.npz")
    assert sorted(got.files) == sorted(expected.files)
    for name in expected.files:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)
