"""Reading a task's place from Slurm's variables, and refusing what would train N independent copies.

The variables are those ``srun``/``sbatch`` set (as measured on a one-host Slurm: the real launches are in the
process tests); here they are set by hand to cover multi-node layouts one host cannot start.
"""

from __future__ import annotations

import pytest

from drivetrain import Trainer
from drivetrain._distributed import (
    check_not_batch_shell,
    expand_hostlist,
    expand_tasks_per_node,
    rerun_slurm_task,
    slurm_step,
    torchrun_variables,
)
from drivetrain.backend import DriverError

from .conftest import drivetrain_numpy, make_regression

STEP = {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "8", "SLURM_NTASKS": "8",
        "SLURM_STEP_NODELIST": "node[01-03],gpu7", "SLURM_STEP_TASKS_PER_NODE": "2(x3),2", "SLURM_NODEID": "2",
        "SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_RESTART_COUNT": "1"}


@pytest.fixture
def no_slurm(monkeypatch):
    import os

    for name in [n for n in os.environ if n.startswith("SLURM_") or n in ("MASTER_PORT", "MASTER_ADDR")]:
        monkeypatch.delenv(name)
    return monkeypatch


@pytest.mark.parametrize(("text", "hosts"), [
    ("node01", ["node01"]),
    ("node[01-03,07]", ["node01", "node02", "node03", "node07"]),
    ("a[8-10],b1", ["a8", "a9", "a10", "b1"]),
    ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
    ("gpu[001-002],cpu[9]", ["gpu001", "gpu002", "cpu9"]),
])
def test_compressed_host_lists_expand_in_order(text: str, hosts: list[str]) -> None:
    assert expand_hostlist(text) == hosts


def test_tasks_per_node_expand_and_a_bad_form_is_named() -> None:
    assert expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert expand_tasks_per_node("4") == [4]
    with pytest.raises(DriverError, match="SLURM_STEP_TASKS_PER_NODE='2x3'"):
        expand_tasks_per_node("2x3")


def test_a_task_of_a_multi_node_step_knows_its_place(no_slurm) -> None:
    for name, value in STEP.items():
        no_slurm.setenv(name, value)
    step = slurm_step()
    assert (step.rank, step.world_size, step.local_rank, step.local_world_size, step.node_rank) == (5, 8, 1, 2, 2)
    assert step.master_addr == "node01" and step.restart_count == 1
    assert [step.host_of(r) for r in range(8)] == ["node01"] * 2 + ["node02"] * 2 + ["node03"] * 2 + ["gpu7"] * 2
    variables = torchrun_variables(step)
    assert variables["RANK"] == "5" and variables["WORLD_SIZE"] == "8" and variables["LOCAL_RANK"] == "1"
    assert variables["MASTER_ADDR"] == "node01" and variables["MASTER_PORT"] == str(20000 + 4242)
    no_slurm.setenv("MASTER_PORT", "29999")  # a port the user names wins
    assert torchrun_variables(slurm_step())["MASTER_PORT"] == "29999"


def test_outside_a_step_or_with_one_task_there_is_no_step(no_slurm) -> None:
    assert slurm_step() is None
    no_slurm.setenv("SLURM_JOB_ID", "7")
    no_slurm.setenv("SLURM_NTASKS", "2")
    assert slurm_step() is None  # the batch shell: not a step
    no_slurm.setenv("SLURM_STEP_ID", "0")
    no_slurm.setenv("SLURM_STEP_NUM_TASKS", "1")
    assert slurm_step() is None  # srun -n 1: one task, a run of one process


def test_variables_that_disagree_are_refused(no_slurm) -> None:
    for name, value in {**STEP, "SLURM_STEP_TASKS_PER_NODE": "2(x3)"}.items():
        no_slurm.setenv(name, value)
    with pytest.raises(DriverError, match="the Slurm variables disagree"):
        slurm_step()


def _trainer(**kwargs):
    model = drivetrain_numpy.LinearModel(3, 1)
    opt = drivetrain_numpy.SGD(model.params, model.grads, lr=0.05)
    loader = drivetrain_numpy.ArrayLoader(make_regression(), batch_size=8)
    return Trainer(model, loader, opt, driver="numpy", progress_bar=None, **kwargs)


def test_a_single_process_driver_in_a_step_of_several_tasks_is_refused_not_run_twice(no_slurm) -> None:
    for name, value in {**STEP, "SLURM_STEP_NODELIST": "host1", "SLURM_STEP_TASKS_PER_NODE": "2",
                        "SLURM_STEP_NUM_TASKS": "2", "SLURM_NTASKS": "2", "SLURM_NODEID": "0",
                        "SLURM_PROCID": "1"}.items():
        no_slurm.setenv(name, value)
    with pytest.raises(DriverError, match=r"task 1 of a Slurm step of 2 tasks .* train 2 independent copies"):
        _trainer()
    no_slurm.setenv("SLURM_STEP_NUM_TASKS", "1")  # the fix it names: one task
    no_slurm.setenv("SLURM_NTASKS", "1")
    no_slurm.setenv("SLURM_STEP_TASKS_PER_NODE", "1")
    no_slurm.setenv("SLURM_PROCID", "0")
    no_slurm.setenv("SLURM_LOCALID", "0")
    _trainer(n_epochs=1).run()


def test_the_batch_shell_of_a_job_of_several_tasks_is_refused_without_srun(no_slurm) -> None:
    no_slurm.setenv("SLURM_JOB_ID", "7")
    no_slurm.setenv("SLURM_NTASKS", "2")
    with pytest.raises(DriverError, match=r"shell of Slurm job 7, which has SLURM_NTASKS=2, but srun did not "
                                          r"start it.*srun python train.py.*nproc="):
        _trainer()
    check_not_batch_shell(nproc=2)  # the Trainer starting the processes itself is fine
    check_not_batch_shell(None, world_size=2)  # so is a rank of mpirun or torchrun run in the batch script
    no_slurm.setenv("SLURM_NTASKS", "1")
    _trainer(n_epochs=1).run()


def test_a_task_that_cannot_run_its_program_again_is_refused_with_the_line_that_works(no_slurm) -> None:
    """jax, oneflow and jittor re-run a task of srun in its place (tested under the real Slurm); a program that
    cannot be run again (here: pytest; python -c, a notebook) is refused before anything changes."""
    import os

    for name, value in STEP.items():
        no_slurm.setenv(name, value)
    with pytest.raises(DriverError, match=r"task 5 of a Slurm step of 8 tasks, which join one oneflow run by running "
                                          r"their program again \(oneflow joins at import\), but it runs under pytest"
                                          r".*Put the training in a script file and start it with srun -n 8 python "
                                          r"train.py\.$"):
        rerun_slurm_task(slurm_step(), {"RANK": "5"}, framework="oneflow", reason="oneflow joins at import",
                         start_yourself="srun -n 8 python train.py")
    assert "RANK" not in os.environ or os.environ["RANK"] != "5"
