"""Reading a task's place from Slurm's variables, and refusing what would train N independent copies.

The variables are those ``srun``/``sbatch`` set (as measured on a one-host Slurm: the real launches are in the
process tests); here they are set by hand to cover multi-node layouts one host cannot start.
"""

from __future__ import annotations

import os

import pytest

from drivetrain import Trainer
from drivetrain._distributed import (
    TASK_PROCESS_ENV,
    check_not_batch_shell,
    check_slurm_world,
    expand_hostlist,
    expand_tasks_per_node,
    rerun_slurm_task,
    slurm_step,
    task_process,
    task_processes_asked,
    torchrun_variables,
)
from drivetrain._distributed.slurm import claim_task_processes
from drivetrain.backend import DriverError

from .conftest import drivetrain_numpy, make_regression

STEP = {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "8", "SLURM_NTASKS": "8",
        "SLURM_STEP_NODELIST": "node[01-03],gpu7", "SLURM_STEP_TASKS_PER_NODE": "2(x3),2", "SLURM_NODEID": "2",
        "SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_RESTART_COUNT": "1"}


@pytest.fixture
def no_slurm(monkeypatch):
    for name in [n for n in os.environ if n.startswith("SLURM_") or n in ("MASTER_PORT", "MASTER_ADDR",
                                                                           TASK_PROCESS_ENV)]:
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
    for name, value in STEP.items():
        no_slurm.setenv(name, value)
    with pytest.raises(DriverError, match=r"task 5 of a Slurm step of 8 tasks, which join one oneflow run by running "
                                          r"their program again \(oneflow joins at import\), but it runs under pytest"
                                          r".*Put the training in a script file and start it with srun -n 8 python "
                                          r"train.py\.$"):
        rerun_slurm_task(slurm_step(), {"RANK": "5"}, framework="oneflow", reason="oneflow joins at import",
                         start_yourself="srun -n 8 python train.py")
    assert "RANK" not in os.environ or os.environ["RANK"] != "5"


def test_each_task_running_nproc_processes_counts_them_in_the_ranks(no_slurm) -> None:
    """nproc=3 in each task of the 8-task step of STEP: a run of 24, task 5 (second task of node03) is ranks
    15..17, local ranks 3..5 of the node's 6; the processes the Trainer starts know their place from the
    variable drivetrain sets, a driver that cannot take it is refused, and one that re-runs the task names the
    srun line that works."""
    for name, value in STEP.items():
        no_slurm.setenv(name, value)
    no_slurm.setenv(TASK_PROCESS_ENV, "")  # unset (empty) now and after the test, whatever the claim writes
    with task_processes_asked(3) as task:
        own = claim_task_processes(slurm_step(), torchrun_variables)
    assert task is not None and task.step is not None and task.step.rank == 5
    assert (own.rank, own.world_size, own.local_rank, own.local_world_size, own.node_rank) == (15, 24, 3, 6, 2)
    assert os.environ[TASK_PROCESS_ENV] == "0/3" and slurm_step() == own
    assert [own.host_of(r) for r in range(0, 24, 6)] == ["node01", "node02", "node03", "gpu7"]
    assert own.host_of(17) == "node03" and own.master_addr == "node01"
    children = {rank: task.child_env(rank) for rank in (16, 17)}
    assert [(env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"], env[TASK_PROCESS_ENV])
            for env in children.values()] == [("16", "4", "24", "6", "1/3"), ("17", "5", "24", "6", "2/3")]
    assert {env["MASTER_ADDR"] for env in children.values()} == {"node01"}
    assert {env["MASTER_PORT"] for env in children.values()} == {str(20000 + 4242)}
    no_slurm.setenv(TASK_PROCESS_ENV, "2/3")  # what process 2 sees
    assert (slurm_step().rank, slurm_step().local_rank, task_process()) == (17, 5, (2, 3))
    with task_processes_asked(3) as again:
        assert again is None  # a process the Trainer started starts none of its own
    no_slurm.setenv(TASK_PROCESS_ENV, "3/3")
    with pytest.raises(DriverError, match="is not 'index/count'"):
        slurm_step()
    no_slurm.delenv(TASK_PROCESS_ENV)
    with task_processes_asked(3), pytest.raises(DriverError, match=r"nproc=3 in task 5 of a Slurm step of 8 tasks, "
                                                                   r"but the jittor driver .* Let srun start all 24 "
                                                                   r"processes, without nproc=: srun --mpi=pmix -n 24 "
                                                                   r"python train\.py\.$"):
        rerun_slurm_task(slurm_step(), {}, framework="jittor", reason="jittor joins MPI at import",
                         start_yourself="srun --mpi=pmix -n {n} python train.py")
    with pytest.raises(DriverError, match=r"nproc=3 in task 5 of a Slurm step of 8 tasks, but the 'numpy' driver "
                                          r"runs this process as one of 3 .* drop nproc="):
        check_slurm_world("numpy", 3, 3)  # a driver that started its own 3: two runs, refused
    with task_processes_asked(1) as one:
        assert one is None  # nproc=1: no processes to start
