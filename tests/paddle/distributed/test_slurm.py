"""paddle under a real one-host Slurm (tests/_slurm.py): ``srun -n 2 python train.py`` is one run of two ranks
(paddle's variables taken from Slurm's), the same as the Trainer's own ``nproc=2``, evaluation and
prediction included; a job preempted by ``scancel --signal=USR1`` stops both ranks at one step, saves, closes
its records as preempted, requeues itself and, resumed, ends with the parameters of the unbroken ``nproc=2``
run (torch's test does the same: tests/torch/distributed/test_slurm.py); ``srun -n 2`` with ``nproc=2`` in each
task is one run of 4, equal to ``nproc=4``."""

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


def test_srun_n2_is_one_run_equal_to_nproc_2_and_a_preempted_job_resumes_exactly(slurm_cluster, tmp_path) -> None:
    spawned, srun, preempted = tmp_path / "nproc", tmp_path / "srun", tmp_path / "preempted"
    for folder in (spawned, srun, preempted):
        folder.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    subprocess.run([sys.executable, str(SCRIPT), "train", str(spawned), "full,slurm", "--nproc", "2"], check=True,
                   timeout=240, env=env, cwd=tmp_path)
    slurm_cluster.run(["srun", "-n", "2", sys.executable, str(SCRIPT), "train", str(srun), "full"], timeout=240,
                      cwd=tmp_path)
    for rank in (0, 1):
        expected = json.loads((spawned / f"full-rank{rank}.json").read_text())
        got = json.loads((srun / f"full-rank{rank}.json").read_text())
        assert (got["rank"], got["world_size"]) == (rank, 2)
        for key in ("params", "seen", "eval", "predict"):
            assert got[key] == expected[key], key

    job, text = slurm_cluster.preempt_and_resume(
        f"srun {sys.executable} {SCRIPT} train {preempted} slurm --slow 0.25", preempted / "started", "-n", "2",
        cwd=tmp_path)
    assert "preempted at step" in text and "the job is requeued" in text, slurm_cluster.describe(job)
    first = [json.loads((preempted / f"slurm0-rank{rank}.json").read_text()) for rank in (0, 1)]
    second = [json.loads((preempted / f"slurm1-rank{rank}.json").read_text()) for rank in (0, 1)]
    stop = first[0]["steps"][1]
    assert [r["steps"] for r in first] == [[0, stop]] * 2 and 0 < stop < 12, first  # both ranks at one step
    assert [r["steps"] for r in second] == [[stop, 12]] * 2, second  # the requeued run resumed from there
    summary = json.loads((preempted / "run-0" / "summary.json").read_text())
    assert summary["status"] == "preempted" and summary["step"] == stop, summary
    hparams = json.loads((preempted / "run-1" / "hparams.json").read_text())
    assert (hparams["slurm_job_id"], hparams["slurm_restart_count"]) == (str(job), 1), hparams
    for rank in (0, 1):
        expected = json.loads((spawned / f"slurmnproc-rank{rank}.json").read_text())
        assert second[rank]["params"] == expected["params"], rank  # bit-identical: floats in full in JSON


def test_each_task_starting_nproc_processes_is_one_run_equal_to_nproc_4(slurm_cluster, tmp_path) -> None:
    """srun -n 2 with nproc=2 in each task's Trainer: one run of 4 (paddle's variables of each process taken from
    Slurm's and its place among the task's), the parameters of the Trainer's own nproc=4."""
    spawned, srun = tmp_path / "nproc", tmp_path / "srun"
    for folder in (spawned, srun):
        folder.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    subprocess.run([sys.executable, str(SCRIPT), "train", str(spawned), "slurm", "--nproc", "4"], check=True,
                   timeout=240, env=env, cwd=tmp_path)
    slurm_cluster.run(["srun", "-n", "2", sys.executable, str(SCRIPT), "train", str(srun), "slurm", "--nproc", "2"],
                      timeout=240, cwd=tmp_path)
    for rank in range(4):
        expected = json.loads((spawned / f"slurmnproc-rank{rank}.json").read_text())
        got = json.loads((srun / f"slurm0-rank{rank}.json").read_text())
        assert (got["rank"], got["world_size"], got["steps"]) == (rank, 4, [0, 6]), got
        assert got["params"] == expected["params"], rank  # bit-identical: floats in full in JSON
