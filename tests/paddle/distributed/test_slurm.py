"""paddle under a real one-host Slurm (tests/_slurm.py): ``srun -n 2 python train.py`` is one run of two ranks
(paddle's variables taken from Slurm's), the same as the Trainer's own ``nproc=2``, evaluation and
prediction included; the preemption flow is torch's (tests/torch/distributed/test_slurm.py), common to every
backend."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import _slurm

SCRIPT = Path(__file__).with_name("_dist_script.py")
ROOT = Path(__file__).resolve().parents[3]
slurm_cluster = _slurm.slurm_cluster

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(300)]


def test_srun_n2_is_one_run_equal_to_nproc_2(slurm_cluster, tmp_path) -> None:
    spawned, srun = tmp_path / "nproc", tmp_path / "srun"
    spawned.mkdir()
    srun.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    subprocess.run([sys.executable, str(SCRIPT), "train", str(spawned), "full", "--nproc", "2"], check=True,
                   timeout=240, env=env, cwd=tmp_path)
    slurm_cluster.run(["srun", "-n", "2", sys.executable, str(SCRIPT), "train", str(srun), "full"], timeout=240,
                      cwd=tmp_path)
    for rank in (0, 1):
        expected = json.loads((spawned / f"full-rank{rank}.json").read_text())
        got = json.loads((srun / f"full-rank{rank}.json").read_text())
        assert (got["rank"], got["world_size"]) == (rank, 2)
        for key in ("params", "seen", "eval", "predict"):
            assert got[key] == expected[key], key
