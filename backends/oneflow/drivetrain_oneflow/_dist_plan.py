"""Which process layout a oneflow Trainer asks for: decided once, from ``device=``, ``nproc=`` and the environment.

oneflow joins its distributed environment when it is *imported*, from the variables
``oneflow.distributed.launch`` sets (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR``, ``MASTER_PORT``); there is no ``init_process_group`` to call later.
:meth:`drivetrain.backend.DeviceRules.launch` decides, with oneflow's device calls
(``DEVICES``), between:

- ``env``: this process was started by ``python -m oneflow.distributed.launch`` as one of
  ``WORLD_SIZE > 1``; oneflow is already connected to the others (``spawned``: the
  same, started by the Trainer's supervisor);
- ``spawn``: ``nproc=N`` or ``device=[0, 1]`` in a plain ``python train.py``. This
  process imported oneflow alone and cannot join a group any more, so it becomes a
  supervisor: it runs the script again as N worker processes and exits with their verdict;
- (none: a task of a Slurm step of several tasks, ``srun -n N python train.py``, which imported
  oneflow alone, runs its command again in its place, ``exec``, with the launcher's variables
  taken from Slurm's, so that oneflow joins the step's tasks when it is imported again:
  :func:`._launch.rerun`).

Everything else here is validation (nothing is started), so a wrong combination fails in
the first process, before any other is started.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

import oneflow as flow

from drivetrain.backend import (
    LAUNCH_OPTION_DOCS,
    DeviceRules,
    DriverError,
    LauncherEnv,
    LauncherVars,
    check_layout_arguments,
    plan_options,
    read_launcher_env,
    slurm_step,
    torchrun_variables,
    wrapper_options,
)
from drivetrain.backend import DistPlan as CoreDistPlan

from ._device import explicit_cuda, model_device, parse_device, resolve_device

DEFAULT_TIMEOUT = 60.0
DIST_KWARGS = {
    "timeout": "seconds (default 60): the longest one driver operation (forward, backward, step, a collective) "
    "may wait for the other processes before this process gives up (oneflow's collectives have none), and how "
    "long the Trainer's supervisor lets the others stop by themselves after one failed",
    "ddp_kwargs": "dict passed to oneflow.nn.parallel.DistributedDataParallel (broadcast_buffers, bucket_size)",
    **LAUNCH_OPTION_DOCS,
}
ARGUMENT = "oneflow_kwargs"
DDP_OPTIONS = ("broadcast_buffers", "bucket_size")
_LAUNCH_HINT = ("Start every process with python -m oneflow.distributed.launch --nproc_per_node N train.py, which "
                "sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT before oneflow is imported")
ONEFLOW_LAUNCH = LauncherVars(rank="RANK", world_size="WORLD_SIZE", local_rank=("LOCAL_RANK",),
                              local_world_size="LOCAL_WORLD_SIZE", hint=_LAUNCH_HINT,
                              start="python -m oneflow.distributed.launch --nproc_per_node {n} train.py",
                              from_slurm=torchrun_variables)


@dataclasses.dataclass(frozen=True, kw_only=True)
class DistPlan(CoreDistPlan):
    """One process's place in a oneflow run: ``launch`` is ``"env"`` (a worker oneflow's launcher started),
    ``"spawned"`` (one the supervisor started) or ``"spawn"`` (the supervisor); ``device`` is a ``oneflow.device``."""

    ddp_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)


def plan_distributed(model: Any, device: Any, nproc: Any, options: Mapping[str, Any]) -> DistPlan | None:
    """The distributed layout asked for, or None for one process (the single-device driver)."""
    check_layout_arguments(nproc, device)
    launched = _launched()
    step = slurm_step() if launched is None else None
    if step is not None:  # nproc= in a step is refused once the task joined (check_slurm_world)
        plan_options(options, default_timeout=DEFAULT_TIMEOUT, argument=ARGUMENT)  # a wrong option fails here
        from ._launch import rerun

        rerun(step)  # this task of srun, again, with the variables oneflow joins the others by
    launch = DEVICES.launch(nproc, device, launched, model)
    if launch is None:
        return None
    how, device, env = launch
    if how == "spawn" and isinstance(device, (list, tuple)):
        indices = sorted(d.index for d in DEVICES.listed(device))
        if indices != list(range(len(indices))):
            raise DriverError(
                f"device={list(device)!r}: the workers the Trainer starts use GPUs 0..{len(indices) - 1} by local "
                "rank; to use other GPUs, set CUDA_VISIBLE_DEVICES (e.g. CUDA_VISIBLE_DEVICES=2,3) and pass "
                "device='cuda'."
            )
    resolved = DEVICES.for_rank(device, model, env.local_rank, env.local_world_size)
    if resolved.type == "cpu":
        resolved = flow.device("cpu", env.local_rank)  # oneflow numbers each local process's CPU by its local rank
    return DistPlan(launch=how, world_size=env.world_size, rank=env.rank, local_rank=env.local_rank,
                    device=resolved, backend="oneflow",
                    **plan_options(options, default_timeout=DEFAULT_TIMEOUT, argument=ARGUMENT),
                    ddp_kwargs=_ddp_kwargs(options))


def _launched() -> LauncherEnv | None:
    """What oneflow's launcher (or the supervisor) told this process; None where nobody launched it (oneflow
    itself then sets ``RANK=-1``, ``WORLD_SIZE=1``)."""
    if os.environ.get("RANK", "-1") == "-1" and os.environ.get("WORLD_SIZE", "1") == "1":
        return None
    env = read_launcher_env(ONEFLOW_LAUNCH)
    joined = flow.env.get_world_size()
    if env is not None and joined != env.world_size:
        raise DriverError(
            f"WORLD_SIZE={env.world_size} is set, but oneflow was imported as a group of {joined} process(es): "
            f"oneflow reads these variables when it is imported, so they were set too late. {_LAUNCH_HINT}."
        )
    return env


# ---------------------------------------------------------------------------- devices
def _parse_listed(item: Any, given: str) -> flow.device:
    """One entry of a device list, a GPU checked to exist; the error prefixed by the whole list."""
    try:
        parsed = parse_device(item)
        return explicit_cuda(item, parsed) if parsed.type == "cuda" else parsed
    except DriverError as exc:
        raise DriverError(f"{given}: {exc}") from None


def _gpu_for_rank(device: Any, model: Any, local_rank: int, local_world: int) -> flow.device:
    return explicit_cuda(device, flow.device("cuda", local_rank))


DEVICES = DeviceRules(names=ONEFLOW_LAUNCH, model_device=model_device, resolve=resolve_device,
                      on_gpu=lambda d: d.type == "cuda",
                      gpu_count=lambda: flow.cuda.device_count() if flow.cuda.is_available() else 0,
                      gpu_for_rank=_gpu_for_rank, parse_listed=_parse_listed)


def _ddp_kwargs(options: Mapping[str, Any]) -> dict[str, Any]:
    return wrapper_options(options, "ddp_kwargs", argument=ARGUMENT, wrapper="DistributedDataParallel",
                           accepted=DDP_OPTIONS, note=" oneflow 0.9's DistributedDataParallel has no other; "
                           "broadcast_parameters is always on: every process starts from rank 0's weights.")
