"""The one-host Slurm of tests/_slurm.py works as the backends' Slurm tests need it (issue 40): ``srun -n 2``
starts two ranks with the variables a driver reads, signals reach the steps or the batch shell as Slurm
documents, a requeued job starts again (nudged) with ``SLURM_RESTART_COUNT=1``, and the cluster leaves no
process behind, not even when the test session is killed. No framework: it runs in the core env."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests import _slurm
from tests._slurm import OneHostSlurm, _marked_pids, _zombie

slurm_cluster = _slurm.slurm_cluster  # the session fixture (an assignment: ruff's F401/F811 stay quiet)

# Quick (one cluster, ~1 s to start; each test a second or two): they run with the core's local tests.

STEP = """
import signal, sys, time
count = 0
def got(signum, frame):
    global count
    count += 1
    print(f"step USR1 {count}", flush=True)
signal.signal(signal.SIGUSR1, got)
print("step ready", flush=True)
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    time.sleep(0.05)
"""

BATCH = """
n=0
trap 'n=$((n+1)); echo "batch USR1 $n"' USR1
srun -n 1 {python} {step} 120 &
step=$!
# bash runs a trap only between commands; wait returns early when one arrives, so wait again
while kill -0 $step 2>/dev/null; do wait $step; done
echo "batch end"
"""


def _step_script(tmp_path: Path) -> Path:
    path = tmp_path / "step.py"
    path.write_text(textwrap.dedent(STEP))
    return path


def _counts(text: str) -> tuple[int, int]:
    lines = text.splitlines()
    return (sum(line.startswith("step USR1") for line in lines), sum(line.startswith("batch USR1") for line in lines))


def test_srun_starts_two_ranks(slurm_cluster: OneHostSlurm) -> None:
    code = ("import os; print(os.environ['SLURM_PROCID'], os.environ['SLURM_NTASKS'], "
            "os.environ['SLURM_STEP_NODELIST'], os.environ['SLURM_LOCALID'])")
    out = slurm_cluster.run(["srun", "-n", "2", sys.executable, "-c", code], timeout=60).stdout
    node = slurm_cluster.node
    assert sorted(out.splitlines()) == [f"0 2 {node} 0", f"1 2 {node} 1"]


def test_srun_mpi_pmix_where_libpmix_is_installed(slurm_cluster: OneHostSlurm) -> None:
    if not slurm_cluster.pmix:
        pytest.skip("libpmix is not installed (apt-get install libpmix-dev before the cluster starts)")
    out = slurm_cluster.run(["srun", "--mpi=pmix", "-n", "2", "printenv", "PMIX_RANK"], timeout=60).stdout
    assert sorted(out.split()) == ["0", "1"]


def test_scancel_signal_reaches_steps_batch_shell_or_both(slurm_cluster: OneHostSlurm, tmp_path: Path) -> None:
    """``scancel --signal=USR1``: the steps only; ``--batch``: the batch shell only; ``--full``: both."""
    cluster = slurm_cluster
    script = BATCH.format(python=sys.executable, step=_step_script(tmp_path))
    job = cluster.sbatch(script, "--requeue", "--signal=USR1@60", "--time=10", cwd=tmp_path)
    try:
        cluster.wait_job(job, "RUNNING")
        cluster.wait_output(job, r"^step ready$")

        cluster.run(["scancel", "--signal=USR1", str(job)], timeout=10)
        text = cluster.wait_output(job, r"^step USR1 1$", timeout=10)
        time.sleep(0.5)
        assert _counts(cluster.read_output(job)) == (1, 0), text

        cluster.run(["scancel", "--signal=USR1", "--batch", str(job)], timeout=10)
        text = cluster.wait_output(job, r"^batch USR1 1$", timeout=10)
        time.sleep(0.5)
        assert _counts(cluster.read_output(job)) == (1, 1), text

        cluster.run(["scancel", "--signal=USR1", "--full", str(job)], timeout=10)
        cluster.wait_output(job, r"^step USR1 2$", timeout=10)
        text = cluster.wait_output(job, r"^batch USR1 2$", timeout=10)
        time.sleep(0.5)
        assert _counts(cluster.read_output(job)) == (2, 2), text
        assert cluster.job_info(job)["JobState"] == "RUNNING"  # a trapped USR1 stops nothing
    finally:
        cluster.cancel_all()


@pytest.mark.slow
@pytest.mark.distributed  # ~27 s waiting for slurmctld's time-limit check
def test_timed_signal_reaches_steps_or_batch_shell(slurm_cluster: OneHostSlurm, tmp_path: Path) -> None:
    """``--signal=USR1@T`` reaches the steps, ``--signal=B:USR1@T`` the batch shell; with ``--time=1`` and
    ``T=45`` it comes at slurmctld's first 30-second time-limit check, 0 to 30 s after the start."""
    cluster = slurm_cluster
    script = BATCH.format(python=sys.executable, step=_step_script(tmp_path))
    steps = cluster.sbatch(script, "--requeue", "--time=1", "--signal=USR1@45", cwd=tmp_path)
    batch = cluster.sbatch(script, "--requeue", "--time=1", "--signal=B:USR1@45", cwd=tmp_path)
    try:
        for job in (steps, batch):
            cluster.wait_job(job, "RUNNING")
        cluster.wait_output(steps, r"^step USR1 1$", timeout=45)
        cluster.wait_output(batch, r"^batch USR1 1$", timeout=45)
        time.sleep(0.5)
        assert _counts(cluster.read_output(steps)) == (1, 0), cluster.read_output(steps)
        assert _counts(cluster.read_output(batch)) == (0, 1), cluster.read_output(batch)
    finally:
        cluster.cancel_all()


def test_requeue_then_nudge_runs_again(slurm_cluster: OneHostSlurm, tmp_path: Path) -> None:
    cluster = slurm_cluster
    job = cluster.sbatch('echo "run restart=${SLURM_RESTART_COUNT:-unset}"\nsleep 120', "--requeue", cwd=tmp_path)
    try:
        cluster.wait_job(job, "RUNNING")
        cluster.wait_output(job, r"^run restart=unset$")
        cluster.run(["scontrol", "requeue", str(job)], timeout=10)
        info = cluster.wait_job(job, "PENDING", restarts=1)
        assert info["Reason"] == "BeginTime"  # it would wait ~2 min without the nudge
        cluster.nudge(job)
        cluster.wait_job(job, "RUNNING", restarts=1)
        text = cluster.wait_output(job, r"^run restart=1$")
        assert "run restart=unset" in text  # --open-mode=append kept the first run's output
    finally:
        cluster.cancel_all()


def _left(root: Path) -> list[int]:
    return [pid for pid in _marked_pids(str(root)) if not _zombie(pid)]


def _wait_gone(root: Path, timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while (left := _left(root)) or root.exists():
        if time.monotonic() > deadline:
            return left or [-1]
        time.sleep(0.1)
    return []


_RUNNING = '"step up"; sleep 300'


def _start_running_job(cluster: OneHostSlurm) -> int:
    job = cluster.sbatch(f"srun -n 1 bash -c 'echo {_RUNNING}' &\nwait")
    cluster.wait_job(job, "RUNNING")
    cluster.wait_output(job, r"^step up$")
    return job


def test_stop_leaves_no_process(slurm_cluster: OneHostSlurm) -> None:
    """Leaving the cluster ends the daemons and a running job's slurmstepd and tasks (which left the daemons'
    tree), and removes its folder."""
    with OneHostSlurm() as cluster:
        _start_running_job(cluster)
        root = cluster.root
        daemons = [proc.pid for proc in cluster._procs.values()]
        assert len(_left(root)) > len(daemons)  # slurmstepd and the tasks carry the marker too
    assert _wait_gone(root, 5) == []


def test_killed_session_leaves_no_process(slurm_cluster: OneHostSlurm, tmp_path: Path) -> None:
    """A test session killed with SIGKILL (no teardown runs) leaves nothing either: the watchdog cleans up."""
    code = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
        from tests._slurm import OneHostSlurm
        from tests.core.test_slurm_cluster import _start_running_job
        cluster = OneHostSlurm().__enter__()
        _start_running_job(cluster)
        print(cluster.root, flush=True)
        time.sleep(300)
    """)
    owner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        line = owner.stdout.readline().strip()
        assert line, f"the owner did not start its cluster (exit {owner.wait(timeout=30)})"
        root = Path(line)
        assert _left(root)
        owner.kill()
    finally:
        owner.kill()
        owner.wait(timeout=10)
        owner.stdout.close()
    assert _wait_gone(root, 20) == []
