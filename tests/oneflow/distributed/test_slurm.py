"""oneflow under a real one-host Slurm (tests/_slurm.py): ``srun -n 2 python train.py`` is one run of two ranks,
the same as the Trainer's own ``nproc=2`` (parameters, samples seen, evaluation, prediction). oneflow joins its
peers when it is imported, and each task imported it alone before the Trainer: the task runs its program again in
its place (same pid) with ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` taken from Slurm's."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests import _slurm

from .conftest import SCRIPT, child_env

slurm_cluster = _slurm.slurm_cluster

pytestmark = [pytest.mark.distributed, pytest.mark.oneflow, pytest.mark.timeout(300)]
LAUNCH = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def test_srun_n2_is_one_run_equal_to_nproc_2(slurm_cluster, tmp_path, monkeypatch) -> None:
    for name in LAUNCH:  # this session imported oneflow, which set them to its one-process defaults
        monkeypatch.delenv(name, raising=False)
    spawned, srun = tmp_path / "nproc", tmp_path / "srun"
    spawned.mkdir()
    srun.mkdir()
    subprocess.run([sys.executable, SCRIPT, "train", str(spawned), "--nproc", "2"], check=True, timeout=180,
                   env={k: v for k, v in child_env().items() if not k.startswith("SLURM_")}, cwd=tmp_path)
    done = slurm_cluster.run(["srun", "-n", "2", sys.executable, SCRIPT, "train", str(srun)], timeout=180,
                             env={"OMP_NUM_THREADS": "1", "GLOG_minloglevel": "2"}, cwd=tmp_path)
    assert "tasks of this Slurm step join one run: each runs its program again" in done.stderr, done.stderr[-3000:]
    for rank in (0, 1):
        expected = json.loads((spawned / f"train-rank{rank}.json").read_text())
        got = json.loads((srun / f"train-rank{rank}.json").read_text())
        assert (got["rank"], got["world_size"]) == (rank, 2)
        for key in ("params", "seen", "eval", "predicted", "predicted_idx"):
            assert got[key] == expected[key], key
