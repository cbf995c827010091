"""torch under a real one-host Slurm (tests/_slurm.py): ``srun -n 2`` is one run of two ranks, the same as
``nproc=2``; a job preempted by ``scancel --signal=USR1`` saves, requeues itself and, resumed, ends with the
same parameters; ``python train.py`` in the batch shell of a two-task job is refused."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests import _slurm

SCRIPT = Path(__file__).with_name("_slurm_script.py")
ROOT = Path(__file__).resolve().parents[3]
slurm_cluster = _slurm.slurm_cluster

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(300)]
SUITE_SECONDS = 52  # seconds, measured alone (tests/conftest.py splits the process tests into shards by it)


def _reference(tmp_path: Path, nproc: int = 2) -> dict[str, np.ndarray]:
    """The same training started by the Trainer itself (``nproc``), outside Slurm."""
    out = tmp_path / "nproc"
    out.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    subprocess.run([sys.executable, str(SCRIPT), str(out), "--nproc", str(nproc)], check=True, timeout=180, env=env,
                   cwd=ROOT)
    return dict(np.load(out / f"final-nproc{nproc}.npz"))


def _equal(got: Path, expected: dict[str, np.ndarray]) -> None:
    final = dict(np.load(got))
    assert final.keys() == expected.keys()
    for name in expected:
        np.testing.assert_array_equal(final[name], expected[name], err_msg=name)


def test_srun_is_one_run_and_a_preempted_job_requeues_and_resumes_exactly(slurm_cluster, tmp_path) -> None:
    expected = _reference(tmp_path)

    out = tmp_path / "srun"
    out.mkdir()
    slurm_cluster.run(["srun", "-n", "2", sys.executable, str(SCRIPT), str(out)], timeout=180, cwd=ROOT)
    ranks = sorted((out / "ranks.txt").read_text().split("\n")[:-1])
    assert ranks == ["0 2 0 12", "1 2 0 12"], ranks  # two ranks of one run: 96 samples / (8 x 2) x 2 epochs
    _equal(out / "final-0.npz", expected)

    out = tmp_path / "preempted"
    out.mkdir()
    job, text = slurm_cluster.preempt_and_resume(f"srun {sys.executable} {SCRIPT} {out} --slow 0.25", out / "started",
                                                 "-n", "2", cwd=ROOT)
    assert "preempted at step" in text and "the job is requeued" in text, slurm_cluster.describe(job)
    assert (out / "ckpt" / "last").is_dir()
    _equal(out / "final-1.npz", expected)
    lines = (out / "ranks.txt").read_text().split("\n")[:-1]
    stopped = [line for line in lines if not line.endswith(" 12")]
    assert len(stopped) == 2 and len({line.split()[3] for line in stopped}) == 1, lines  # both at one step


def test_each_task_starting_nproc_processes_is_one_run_of_all_of_them(slurm_cluster, tmp_path) -> None:
    """srun -n 2 with nproc=2 in each task's Trainer (on several nodes: srun -N 2 --ntasks-per-node 1): one run of
    4 processes, the parameters of nproc=4."""
    expected = _reference(tmp_path, nproc=4)
    out = tmp_path / "srun"
    out.mkdir()
    slurm_cluster.run(["srun", "-n", "2", sys.executable, str(SCRIPT), str(out), "--nproc", "2"], timeout=180,
                      cwd=ROOT)
    ranks = sorted((out / "ranks.txt").read_text().split("\n")[:-1])
    assert ranks == [f"{rank} 4 0 6" for rank in range(4)], ranks  # 96 samples / (8 x 4) x 2 epochs
    _equal(out / "final-nproc2.npz", expected)  # the script names the file by its nproc=


def test_python_in_the_batch_shell_of_a_two_task_job_is_refused(slurm_cluster, tmp_path) -> None:
    job = slurm_cluster.sbatch(f"{sys.executable} {SCRIPT} {tmp_path}", "-n", "2", cwd=ROOT)
    slurm_cluster.wait_job(job, {"FAILED", "COMPLETED"}, timeout=120)
    text = slurm_cluster.read_output(job)
    assert "srun did not start it, so it would train alone" in text, slurm_cluster.describe(job)
    assert not (tmp_path / "ranks.txt").exists()
