"""Framework-neutral checks of a distributed layout: ``nproc=`` and device lists, launcher counts, options.

A backend decides its layout once, before any process starts (its ``_dist_plan``
module), so a wrong combination fails in the first process. The framework-specific
parts (which environment variables its launcher sets, what a device is) stay there;
the rules and messages every backend shares are here. ``argument`` is the Trainer
argument holding the backend's options (``"torch_kwargs"``), ``hint`` the sentence
saying how to start processes with the framework's launcher.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Mapping
from typing import Any

from .._common import DriverError, bool_option
from .slurm import SlurmStep, claim_task_processes, slurm_step, task_process

LAUNCHES = ("existing", "env", "spawned", "spawn")
SPAWN_OUTPUTS = ("inherit", "prefix")


@dataclasses.dataclass(frozen=True, kw_only=True)
class DistPlan:
    """One process's place in a distributed run and the options it runs with; a backend subclasses it.

    ``launch`` is one of :data:`LAUNCHES`: ``"existing"`` (the user initialised the
    framework's process group), ``"env"`` (the framework's launcher started this
    process), ``"spawned"`` (the Trainer started it) or ``"spawn"`` (this process is rank
    0 and starts the others).
    """

    launch: str
    world_size: int
    rank: int
    local_rank: int
    device: Any
    backend: str
    """The communication library: ``"gloo"``, ``"nccl"``, ``"mpi"``, ..."""
    timeout: float
    even_batches: bool = False
    spawn_output: str = "inherit"
    master: tuple[str, int] | None = None
    """(address, port) of the rendezvous store, where there is one."""


def check_layout_arguments(nproc: Any, device: Any) -> bool:
    """Refuse a bad ``nproc`` or an empty device list; True when ``device`` is a list (one per process)."""
    if nproc is not None and (not isinstance(nproc, int) or isinstance(nproc, bool) or nproc < 1):
        raise DriverError(f"nproc={nproc!r} is not accepted; it must be an int >= 1 (the number of processes).")
    listed = isinstance(device, (list, tuple))
    if listed and not device:
        raise DriverError("device=[] is empty; pass one device, or a list of the GPUs to train on, e.g. [0, 1].")
    return listed


def processes_wanted(nproc: int | None, device: Any) -> int:
    """How many processes ``nproc`` and a device list ask for together (one per listed device)."""
    listed = isinstance(device, (list, tuple))
    if nproc is not None and listed and nproc != len(device) and len(device) > 1:
        raise DriverError(
            f"nproc={nproc} but device={list(device)!r} lists {len(device)} devices; one process runs per "
            "listed device, so drop nproc or make the two agree."
        )
    return max(len(device) if listed else 1, nproc or 1)


def check_process_count(asked: Any, actual: int, what: str, *, start: str) -> None:
    """``nproc=asked`` must match the ``actual`` size of a run already started (``what`` says who said so).

    ``start`` shows how to start ``{n}`` processes, e.g. ``"torchrun --nproc_per_node {n} train.py"``.
    """
    if asked is not None and asked != actual:
        raise DriverError(
            f"nproc={asked} but this process belongs to a distributed run of {actual} process(es) ({what}="
            f"{actual}); drop nproc (the launcher decides how many processes run) or start {asked} processes, "
            f"e.g. {start.format(n=asked)}."
        )


def env_int(name: str, default: int | None = None, *, hint: str) -> int:
    """The integer environment variable ``name`` (``default`` when unset; unset without one is an error)."""
    raw = os.environ.get(name)
    if raw is None:
        if default is None:
            raise DriverError(f"the environment variable {name} is not set. {hint}.")
        return default
    try:
        return int(raw)
    except ValueError:
        raise DriverError(f"the environment variable {name}={raw!r} is not an integer. {hint}.") from None


def env_address(name: str, *, hint: str, value: str | None = None) -> tuple[str, int]:
    """The ``host:port`` environment variable ``name`` as (host, port); ``value``: one entry of its list instead."""
    text = os.environ[name] if value is None else value
    host, _, port = text.strip().rpartition(":")
    if not host or not port.isdigit():
        raise DriverError(f"the environment variable {name}={text!r} is not host:port. {hint}.")
    return host, int(port)


def env_master(*, hint: str) -> tuple[str, int] | None:
    """(``MASTER_ADDR``, ``MASTER_PORT``), the rendezvous store most launchers name; None unless both are set."""
    if os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT"):
        return os.environ["MASTER_ADDR"], env_int("MASTER_PORT", hint=hint)
    return None


def timeout_option(options: Mapping[str, Any], *, default: float, argument: str) -> float:
    """``options['timeout']``: seconds > 0 (``default`` when absent)."""
    value = options.get("timeout", default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise DriverError(
            f"{argument}['timeout']={value!r} is not accepted; pass a number of seconds > 0 (default {default:g})."
        )
    return float(value)


def choice_option(options: Mapping[str, Any], key: str, choices: tuple[str, ...], default: Any, *,
                  argument: str) -> Any:
    """``options[key]``, one of ``choices`` (``default`` when absent, not checked)."""
    if key not in options:
        return default
    value = options[key]
    if value not in choices:
        raise DriverError(f"{argument}[{key!r}]={value!r} is not accepted; use one of {list(choices)}.")
    return value


@dataclasses.dataclass(frozen=True, kw_only=True)
class LauncherVars:
    """The variables a framework's launcher sets in each process, and the words its messages use.

    ``local_rank`` lists the names of the local rank, the first one set wins (the global
    rank when none is). ``rank_word``/``local_rank_word`` name the ranks in messages
    (default: the first variable name); ``gpu`` is the framework's word for "any GPU"
    (``"cuda"``); ``hint`` says how to start processes with the launcher and ``start``
    how to start ``{n}`` of them.
    """

    rank: str
    world_size: str
    local_rank: tuple[str, ...]
    local_world_size: str
    hint: str
    start: str
    needed_when_many: tuple[str, ...] = ()
    """Variables that must be set (not empty) when the world has more than one process."""
    rank_word: str = ""
    local_rank_word: str = ""
    gpu: str = "cuda"
    from_slurm: Callable[[SlurmStep], Mapping[str, str]] | None = None
    """This launcher's variables for a task of a Slurm step (``srun -n N``), set when none of them is: the
    step's tasks then form one run, also where each task's Trainer runs ``nproc=`` processes (the function is
    given each one's place). None: this backend cannot take its layout from Slurm (refused)."""

    def words(self) -> tuple[str, str]:
        """(rank word, local rank word) used in messages."""
        return self.rank_word or self.rank, self.local_rank_word or self.local_rank[0]


@dataclasses.dataclass(frozen=True)
class LauncherEnv:
    """What a launcher told this process: its ranks and the sizes of the run and of this machine's share."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int


def read_launcher_env(names: LauncherVars) -> LauncherEnv | None:
    """The launcher's variables of this process, checked; None when neither rank nor world size is set."""
    rank_var, world_var, hint = names.rank, names.world_size, names.hint
    if rank_var not in os.environ and world_var not in os.environ:
        step = slurm_step()
        if step is None or names.from_slurm is None:
            return None  # a step this backend cannot join is refused when the driver is built (check_slurm_world)
        os.environ.update(names.from_slurm(claim_task_processes(step, names.from_slurm)))
    missing = [name for name in (rank_var, world_var) if name not in os.environ]
    if missing:
        present = rank_var if rank_var in os.environ else world_var
        raise DriverError(
            f"{present}={os.environ[present]!r} is set in the environment but {missing[0]} is not. {hint} "
            "(or unset it to train in one process)."
        )
    rank, world = env_int(rank_var, hint=hint), env_int(world_var, hint=hint)
    rank_word, local_word = names.words()
    if world < 1 or not 0 <= rank < world:
        raise DriverError(
            f"the environment says {rank_var}={rank}, {world_var}={world}; {rank_word} must be in "
            f"0..{world_var}-1. {hint}."
        )
    local_rank = rank
    for name in reversed(names.local_rank):
        local_rank = env_int(name, local_rank, hint=hint)
    local_world = env_int(names.local_world_size, world, hint=hint)
    if not 0 <= local_rank < local_world:
        raise DriverError(
            f"the environment says {names.local_rank[0]}={local_rank}, {names.local_world_size}={local_world}; "
            f"{local_word} must be in 0..{names.local_world_size}-1. {hint}."
        )
    if world > 1:
        absent = [name for name in names.needed_when_many if not os.environ.get(name)]
        if absent:
            raise DriverError(f"{world_var}={world} but {' and '.join(absent)} not set. {hint}.")
    return LauncherEnv(rank, world, local_rank, local_world)


def check_launched_layout(nproc: Any, device: Any, env: LauncherEnv, names: LauncherVars) -> None:
    """``nproc=`` and a device list must fit the run the launcher started (one listed device per local process);
    in one of the processes a Slurm task runs, ``nproc=`` counts that task's."""
    place = task_process()
    if place is None:
        check_process_count(nproc, env.world_size, names.world_size, start=names.start)
    elif nproc is not None and nproc != place[1]:
        raise DriverError(
            f"nproc={nproc} but this is process {place[0]} of the {place[1]} its Slurm task runs (nproc={place[1]} "
            "in the task's own process): build the Trainer with the same nproc= in every process.")
    if isinstance(device, (list, tuple)) and len(device) != env.local_world_size:
        raise DriverError(
            f"device={list(device)!r} lists {len(device)} device(s) but this machine runs "
            f"{env.local_world_size} process(es) ({names.local_world_size}); list one device per process, or pass "
            f"device='{names.gpu}' to give each process the GPU of its {_its(names)}."
        )


def one_gpu_for_many(device: Any, processes: int, names: LauncherVars, *, spawn: bool) -> DriverError:
    """The refusal of ``device=`` naming one GPU for several processes (``spawn``: the Trainer starts them)."""
    if spawn:
        return DriverError(
            f"device={device!r} names one GPU but nproc={processes} asks for {processes} processes; pass "
            f"device={list(range(processes))} (the GPUs to use) or device='{names.gpu}' (GPUs 0..{processes - 1})."
        )
    return DriverError(
        f"device={device!r} names one GPU, but {processes} processes run on this machine and would all "
        f"use it; pass device='{names.gpu}' (each process takes the GPU of its {_its(names)}) or a list such as "
        f"device={list(range(processes))}."
    )


def _its(names: LauncherVars) -> str:
    return names.words()[1].removeprefix("the ")


def plan_options(options: Mapping[str, Any], *, default_timeout: float, argument: str) -> dict[str, Any]:
    """The options every backend's plan shares: ``timeout``, ``even_batches`` and ``spawn_output``."""
    return dict(
        timeout=timeout_option(options, default=default_timeout, argument=argument),
        even_batches=bool_option(options, "even_batches", False, argument=argument),
        spawn_output=choice_option(options, "spawn_output", SPAWN_OUTPUTS, "inherit", argument=argument),
    )
