"""Processes started by Slurm's ``srun``: each task's place in the run, read from Slurm's variables.

``srun -n 2 python train.py`` starts two processes that know only Slurm's variables (``SLURM_PROCID``,
``SLURM_NTASKS``, ``SLURM_STEP_NODELIST``...). A backend whose launcher variables are absent takes its rank
from them (:func:`slurm_step`, then its ``LauncherVars.from_slurm``), so the tasks form one run instead of
N independent ones. A framework launcher started by srun (``srun -n 1 torchrun ...``) sets its own variables,
which win. A framework that joins its peers only before it is first used (oneflow and jittor when they are
imported, JAX before its first computation), used alone by the script before the Trainer, runs the task again
in its place with the variables it joins by (:func:`rerun_slurm_task`). The shell of ``sbatch`` or ``salloc``
is not a step: its ``SLURM_NTASKS`` counts tasks that ``srun`` would start, so a process run there directly
trains alone (:func:`check_not_batch_shell`).

``nproc=G`` in the Trainer of each of a step's T tasks (one task per node, each starting G processes) makes one
run of T x G processes where the backend takes its layout from Slurm's variables: process ``i`` of task
``SLURM_PROCID`` is rank ``SLURM_PROCID * G + i``, local rank ``SLURM_LOCALID * G + i`` of the node's tasks x G.
The task's own process is ``i = 0``; the Trainer starts the others with the launcher variables of their place
(:class:`TaskProcesses`), and each process's place is written in :data:`TASK_PROCESS_ENV`.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os
import re
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import NoReturn

from .._common import DriverError
from .spawn import Launcher, relaunch_command, why_not_rerunnable

PORT_BASE, PORT_SPAN = 20000, 20000
"""A step's rendezvous port, unless ``MASTER_PORT`` names one: ``PORT_BASE + job id % PORT_SPAN``, so two jobs
sharing a node rarely collide and every task of one job computes the same port."""
TASK_PROCESS_ENV = "DRIVETRAIN_SLURM_TASK_PROCESS"
"""``"i/G"``: this is process ``i`` of the ``G`` one task of a Slurm step runs (``nproc=G`` in its Trainer; the
task's own process is 0, the Trainer started the others)."""


@dataclasses.dataclass(frozen=True)
class SlurmStep:
    """This task's place in a Slurm job step of several tasks."""

    job_id: int
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    hosts: tuple[str, ...]
    """The step's nodes in order (``SLURM_STEP_NODELIST`` expanded)."""
    tasks_per_node: tuple[int, ...]
    """Processes per node, in the order of ``hosts`` (Slurm's tasks, times ``per_task``)."""
    restart_count: int
    per_task: int | None = None
    """``G`` where each task runs ``G`` processes (``nproc=G``; the ranks count processes, not tasks), else None."""

    def task_process(self, index: int, count: int) -> SlurmStep:
        """Process ``index`` of the ``count`` this task runs, as a place among every task's ``count`` processes
        (rank ``rank * count + index``, local rank ``local_rank * count + index``)."""
        return dataclasses.replace(
            self, rank=self.rank * count + index, world_size=self.world_size * count,
            local_rank=self.local_rank * count + index, local_world_size=self.local_world_size * count,
            tasks_per_node=tuple(tasks * count for tasks in self.tasks_per_node), per_task=count)

    @property
    def master_addr(self) -> str:
        """The first node of the step: where rank 0 runs (Slurm places tasks in node order)."""
        return self.hosts[0]

    @property
    def master_port(self) -> int:
        """``MASTER_PORT`` if set, else a port derived from the job id (the same on every task)."""
        given = os.environ.get("MASTER_PORT")
        return int(given) if given else PORT_BASE + self.job_id % PORT_SPAN

    def host_of(self, rank: int) -> str:
        """The node of task ``rank`` (Slurm's default block distribution: the first node's tasks first)."""
        for host, count in zip(self.hosts, self.tasks_per_node, strict=False):
            if rank < count:
                return host
            rank -= count
        raise DriverError(f"rank {rank} is beyond the tasks of this Slurm step ({self.tasks_per_node}).")


def expand_hostlist(text: str) -> list[str]:
    """Slurm's compressed host list as names: ``"node[01-03,07],gpu1"`` -> node01, node02, node03, node07, gpu1."""
    hosts: list[str] = []
    for item in _split_top_level(text.strip()):
        hosts.extend(_expand_item(item))
    return hosts


def _split_top_level(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += char == "["
        depth -= char == "]"
        if char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [part for part in parts if part]


def _expand_item(item: str) -> list[str]:
    match = re.match(r"^([^\[]*)\[([^\]]*)\](.*)$", item)
    if match is None:
        return [item]
    prefix, ranges, rest = match.groups()
    names = []
    for piece in ranges.split(","):
        low, _, high = piece.partition("-")
        width = len(low)
        for number in range(int(low), int(high or low) + 1):
            names.append(f"{prefix}{number:0{width}d}")
    return [name + tail for name in names for tail in _expand_item(rest) or [""]] if rest else names


def expand_tasks_per_node(text: str) -> list[int]:
    """``SLURM_STEP_TASKS_PER_NODE`` as one count per node: ``"2(x3),1"`` -> [2, 2, 2, 1]."""
    counts: list[int] = []
    for piece in text.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", piece)
        if match is None:
            raise DriverError(f"SLURM_STEP_TASKS_PER_NODE={text!r} is not Slurm's 'N(xM),K' form.")
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts


def _int(name: str, default: int | None = None) -> int:
    value = os.environ.get(name)
    if value is None or value == "":
        if default is None:
            raise DriverError(f"{name} is not set, although this process runs in a Slurm step (SLURM_STEP_ID is).")
        return default
    try:
        return int(value)
    except ValueError:
        raise DriverError(f"{name}={value!r} is not an integer; Slurm sets it to one.") from None


def slurm_step() -> SlurmStep | None:
    """This process's place in a Slurm step of several tasks (``srun -n N``), or None: not under Slurm, in the
    batch shell, or a step of one task. In a step whose tasks each run ``nproc=`` processes
    (:data:`TASK_PROCESS_ENV`), the place of this process among all of them."""
    step = _task_step()
    place = task_process()
    return step.task_process(*place) if step is not None and place is not None else step


def task_process() -> tuple[int, int] | None:
    """``(index, count)``: this is process ``index`` of the ``count`` its Slurm task runs (``nproc=count``), or
    None where the task runs only itself."""
    value = os.environ.get(TASK_PROCESS_ENV)
    if not value:
        return None
    match = re.fullmatch(r"(\d+)/(\d+)", value)
    if match is None or not int(match.group(1)) < int(match.group(2)):
        raise DriverError(f"{TASK_PROCESS_ENV}={value!r} is not 'index/count' with index < count; drivetrain sets "
                          "it in the processes a Slurm task's Trainer starts: unset it.")
    return int(match.group(1)), int(match.group(2))


def _task_step() -> SlurmStep | None:
    """The task's own place in the step (Slurm's variables), or None."""
    if "SLURM_JOB_ID" not in os.environ or "SLURM_STEP_ID" not in os.environ:
        return None
    world = _int("SLURM_STEP_NUM_TASKS", _int("SLURM_NTASKS", 1))
    if world <= 1:
        return None
    hosts = expand_hostlist(os.environ.get("SLURM_STEP_NODELIST") or os.environ.get("SLURM_NODELIST", ""))
    counts = expand_tasks_per_node(os.environ.get("SLURM_STEP_TASKS_PER_NODE")
                                   or os.environ.get("SLURM_TASKS_PER_NODE", str(world)))
    node = _int("SLURM_NODEID", 0)
    if not hosts or len(counts) != len(hosts) or sum(counts) != world or not 0 <= node < len(hosts):
        raise DriverError(
            f"the Slurm variables disagree: {world} task(s) (SLURM_STEP_NUM_TASKS), nodes {hosts} "
            f"(SLURM_STEP_NODELIST), tasks per node {counts}, this node {node}; start the step with srun.")
    rank = _int("SLURM_PROCID")
    local = _int("SLURM_LOCALID", 0)
    if not 0 <= rank < world or not 0 <= local < counts[node]:
        raise DriverError(f"SLURM_PROCID={rank}, SLURM_LOCALID={local} do not fit a step of {world} task(s) with "
                          f"{counts[node]} on this node.")
    return SlurmStep(int(os.environ["SLURM_JOB_ID"]), rank, world, local, counts[node], node, tuple(hosts),
                     tuple(counts), _int("SLURM_RESTART_COUNT", 0))


def torchrun_variables(step: SlurmStep) -> dict[str, str]:
    """The variables ``torchrun`` would set for this task (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
    ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``): the launcher names torch and oneflow read."""
    return {"RANK": str(step.rank), "WORLD_SIZE": str(step.world_size), "LOCAL_RANK": str(step.local_rank),
            "LOCAL_WORLD_SIZE": str(step.local_world_size), "MASTER_ADDR": step.master_addr,
            "MASTER_PORT": str(step.master_port), "GROUP_RANK": str(step.node_rank)}


def check_not_batch_shell(nproc: object, world_size: int = 1) -> None:
    """Refuse a run of one process started directly in the shell of a job of several tasks (``sbatch -n 2``
    without ``srun``): its ``SLURM_NTASKS`` asks for processes that nothing starts. ``nproc=`` (the Trainer
    starts them) is fine, and so is a rank of a launcher's run there (``world_size`` > 1: ``mpirun`` or
    ``torchrun`` in the batch script)."""
    if nproc is not None or world_size > 1 or "SLURM_JOB_ID" not in os.environ or "SLURM_STEP_ID" in os.environ:
        return
    tasks = os.environ.get("SLURM_NTASKS", "1")
    if tasks.isdigit() and int(tasks) > 1:
        raise DriverError(
            f"this process runs in the shell of Slurm job {os.environ['SLURM_JOB_ID']}, which has "
            f"SLURM_NTASKS={tasks}, but srun did not start it, so it would train alone. Start the tasks with "
            "srun (srun python train.py), or pass nproc= to have the Trainer start the processes of this node.")


def check_slurm_world(driver_name: str, world_size: int, nproc: object) -> None:
    """Never N independent runs under ``srun -n N``: a driver built in a Slurm step of several tasks must be
    one of those tasks' run (``world_size`` equal to the step's, every task's ``nproc=`` processes counted, or a
    framework launcher's own larger one)."""
    step = slurm_step()
    if step is None:
        return
    if step.per_task is not None:
        if world_size != step.world_size:
            raise DriverError(
                f"this process is rank {step.rank} of the {step.world_size} processes of a Slurm step whose tasks "
                f"each run nproc={step.per_task}, but the {driver_name!r} driver runs it as {world_size} process(es) "
                "of its own; build every Trainer of the run with a driver that takes its place from Slurm's "
                "variables (torch, paddle) and the same nproc=.")
        return
    if nproc is not None and world_size > 1:
        raise DriverError(
            f"nproc={nproc!r} in task {step.rank} of a Slurm step of {step.world_size} tasks, but the "
            f"{driver_name!r} driver runs this process as one of {world_size} that Slurm's variables did not "
            "place (a launcher inside srun, such as torchrun, placed it, or the driver started its own): drop "
            "nproc= where a launcher started the processes (it decides how many run). nproc= per task works "
            "with the drivers that take their place from Slurm's variables (torch, paddle; see "
            "docs/clusters.md).")
    if world_size == 1:
        raise DriverError(
            f"this process is task {step.rank} of a Slurm step of {step.world_size} tasks (SLURM_PROCID, "
            f"SLURM_NTASKS), but the {driver_name!r} driver runs it as a process of its own: the tasks would "
            f"train {step.world_size} independent copies. Use the driver's distributed form under srun (see "
            "docs/clusters.md), start one task (srun -n 1), or start the framework's launcher with srun.")


@dataclasses.dataclass
class TaskProcesses:
    """``nproc=count`` asked in a task of a Slurm step of several tasks, while its Trainer builds the driver.

    Once the backend takes its place from Slurm's variables (:func:`claim_task_processes`), ``step`` is the
    task's own place and ``variables`` the backend's launcher variables for a place (its
    ``LauncherVars.from_slurm``); :func:`start_task_processes` starts the task's other processes with them.
    """

    count: int
    step: SlurmStep | None = None
    variables: Callable[[SlurmStep], Mapping[str, str]] | None = None

    def child_env(self, rank: int) -> dict[str, str]:
        """The variables of the process of global ``rank`` among this task's."""
        assert self.step is not None and self.variables is not None, "claim_task_processes first"
        index = rank - self.step.rank * self.count
        return {**self.variables(self.step.task_process(index, self.count)),
                TASK_PROCESS_ENV: f"{index}/{self.count}"}


_asked: contextvars.ContextVar[TaskProcesses | None] = contextvars.ContextVar("drivetrain_task_processes", default=None)
"""The request of :func:`task_processes_asked` while a driver is built (per thread: another thread building a
Trainer at the same time sees its own)."""


@contextlib.contextmanager
def task_processes_asked(nproc: object) -> Iterator[TaskProcesses | None]:
    """While a driver is built: ``nproc=`` (an int > 1) in a task of a Slurm step of several tasks, which runs
    that many processes if the backend takes its place from Slurm's variables (yields the request; None where
    there is no such task, or this process is already one of a task's processes)."""
    wanted = nproc if isinstance(nproc, int) and not isinstance(nproc, bool) and nproc > 1 else None
    request = TaskProcesses(wanted) if wanted and task_process() is None and _task_step() is not None else None
    token = _asked.set(request)
    try:
        yield request
    finally:
        _asked.reset(token)


def claim_task_processes(step: SlurmStep, variables: Callable[[SlurmStep], Mapping[str, str]]) -> SlurmStep:
    """The place of a process whose backend takes it from Slurm's variables (``variables``: its launcher's for
    a place): where the Trainer asks ``nproc=`` processes of each task (:func:`task_processes_asked`), this
    task's process 0 among every task's processes (also written in :data:`TASK_PROCESS_ENV`), else ``step``."""
    request = _asked.get()
    if request is None or request.step is not None or step.per_task is not None:
        return step
    request.step, request.variables = step, variables
    os.environ[TASK_PROCESS_ENV] = f"0/{request.count}"
    return step.task_process(0, request.count)


def start_task_processes(request: TaskProcesses, *, timeout: float, output: str, timeout_option: str) -> Launcher:
    """Start processes 1..count-1 of this Slurm task (``nproc=count``), each running this program again with the
    launcher variables of its place; they join the run with this process and every other task's. The launcher
    watches them as it watches the processes of ``nproc=`` outside Slurm (they die with this process; at exit it
    waits for them and fails when one failed)."""
    step, count = request.step, request.count
    assert step is not None, "claim_task_processes first"
    total = step.world_size * count
    why = why_not_rerunnable()
    if why is not None:
        raise DriverError(
            f"nproc={count} in task {step.rank} of a Slurm step of {step.world_size} tasks starts the task's other "
            f"{count - 1} process(es) by running its program again, but {why}. Put the training in a script file "
            f"and start it with srun as now (srun -n {step.world_size} python train.py), or let srun start all "
            f"{total} processes with this program, without nproc= (srun -n {total} ...).")
    launcher = Launcher(total, timeout, output, relaunch_command(f"srun -n {total} python train.py"),
                        timeout_option=timeout_option, mark_children=False)
    first = step.rank * count
    launcher.start(None, request.child_env, ranks=range(first + 1, first + count))
    return launcher


def rerun_slurm_task(step: SlurmStep, variables: Mapping[str, str], *, framework: str, reason: str,
                     start_yourself: str, command: Callable[[str], list[str]] = relaunch_command) -> NoReturn:
    """Run this task of a Slurm step again in its place, with ``variables`` set, for a framework that joins its
    peers only before it is first used, which the script did alone before building the Trainer.

    ``exec`` keeps the process, so Slurm keeps tracking and signalling it; everything before ``Trainer(...)``
    runs twice, and the second time the framework joins the step's other tasks. Rank 0 says so in one line
    (``reason``: why the framework needs it). ``command(start_yourself)`` is the command line to run
    (default: this program's, :func:`~drivetrain.backend.relaunch_command`); a program that cannot be run again
    (a notebook, ``python -c``, pytest) is refused, naming ``start_yourself``, the line to start a script with
    (``{n}`` in it stands for the number of tasks). So is ``nproc=`` per task (:func:`task_processes_asked`):
    a task that runs its program again in its place cannot also start processes of its own."""
    asked = _asked.get()
    if asked is not None:
        total = step.world_size * asked.count
        raise DriverError(
            f"nproc={asked.count} in task {step.rank} of a Slurm step of {step.world_size} tasks, but the "
            f"{framework} driver joins the step's tasks by running each one's program again in its place ({reason}), "
            f"so a task cannot also start processes of its own. Let srun start all {total} processes, without "
            f"nproc=: {start_yourself.format(n=total)}.")
    start_yourself = start_yourself.format(n=step.world_size)
    why = why_not_rerunnable()
    if why is not None:
        raise DriverError(
            f"this process is task {step.rank} of a Slurm step of {step.world_size} tasks, which join one {framework} "
            f"run by running their program again ({reason}), but {why}. Put the training in a script file and "
            f"start it with {start_yourself}.")
    argv = command(start_yourself)
    os.environ.update(variables)
    if step.rank == 0:
        print(f"drivetrain-{framework}: the {step.world_size} tasks of this Slurm step join one run: each runs its "
              f"program again ({reason}).", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(argv[0], argv, os.environ)
