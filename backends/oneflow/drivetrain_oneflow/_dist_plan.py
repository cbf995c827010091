"""Which process layout a oneflow Trainer asks for: decided once, from ``device=``, ``nproc=`` and the environment.

oneflow joins its distributed environment when it is *imported*, from the variables
``oneflow.distributed.launch`` sets (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR``, ``MASTER_PORT``); there is no ``init_process_group`` to call later.
Hence two ways to train distributed:

- ``env``: this process was started by ``python -m oneflow.distributed.launch`` (or the
  Trainer's supervisor, ``spawned``) as one of ``WORLD_SIZE > 1``; oneflow is already
  connected to the others;
- ``spawn``: ``nproc=N`` or ``device=[0, 1]`` in a plain ``python train.py``. This
  process imported oneflow alone and cannot join a group any more, so it becomes a
  supervisor: it runs the script again as N worker processes and exits with their verdict.

Everything here is validation (nothing is started), so a wrong combination fails in
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
    SPAWN_PARENT_ENV,
    DeviceSlot,
    DriverError,
    LauncherVars,
    check_distinct_devices,
    check_enough_gpus,
    check_layout_arguments,
    check_process_count,
    env_int,
    one_gpu_for_many,
    plan_options,
    processes_wanted,
    wrapper_options,
)
from drivetrain.backend import DistPlan as CoreDistPlan

from ._device import explicit_cuda, parse_device

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
                              start="python -m oneflow.distributed.launch --nproc_per_node {n} train.py")


@dataclasses.dataclass(frozen=True, kw_only=True)
class DistPlan(CoreDistPlan):
    """One process's place in a oneflow run: ``launch`` is ``"env"`` (a worker, started by oneflow's
    launcher or by the supervisor) or ``"spawn"`` (the supervisor); ``device`` is a ``oneflow.device``."""

    ddp_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    spawned: bool = False
    """A worker that the Trainer's supervisor started (not oneflow's launcher)."""


def plan_distributed(model: Any, device: Any, nproc: Any, options: Mapping[str, Any]) -> DistPlan | None:
    """The distributed layout asked for, or None for one process (the single-device driver)."""
    check_layout_arguments(nproc, device)
    world = env_int("WORLD_SIZE", 1, hint=_LAUNCH_HINT)
    if world > 1:
        return _worker_plan(model, device, nproc, world, options)
    wanted = processes_wanted(nproc, device)
    if wanted == 1:
        return None
    if os.environ.get("RANK", "-1") != "-1":  # oneflow itself sets RANK=-1 in a process nobody launched
        raise DriverError(
            f"nproc={nproc!r}/device={device!r} asks for {wanted} processes, but this process was started by a "
            f"launcher as a single one (WORLD_SIZE={world}); start {wanted} with python -m "
            f"oneflow.distributed.launch --nproc_per_node {wanted} train.py and drop nproc, or unset RANK."
        )
    kind = _check_devices(device, wanted, model)
    return DistPlan(launch="spawn", world_size=wanted, rank=0, local_rank=0, device=kind, **_common(options))


def _common(options: Mapping[str, Any]) -> dict[str, Any]:
    return dict(backend="oneflow", **plan_options(options, default_timeout=DEFAULT_TIMEOUT, argument=ARGUMENT),
                ddp_kwargs=_ddp_kwargs(options))


def _worker_plan(model: Any, device: Any, nproc: Any, world: int, options: Mapping[str, Any]) -> DistPlan:
    rank, local_rank = env_int("RANK", hint=_LAUNCH_HINT), env_int("LOCAL_RANK", 0, hint=_LAUNCH_HINT)
    if not 0 <= rank < world:
        raise DriverError(f"the environment says RANK={rank}, WORLD_SIZE={world}; RANK must be in 0..WORLD_SIZE-1.")
    joined = flow.env.get_world_size()
    if joined != world:
        raise DriverError(
            f"WORLD_SIZE={world} is set, but oneflow was imported as a group of {joined} process(es): oneflow reads "
            f"these variables when it is imported, so they were set too late. {_LAUNCH_HINT}."
        )
    check_process_count(nproc, world, "WORLD_SIZE", start=ONEFLOW_LAUNCH.start)
    local_world = env_int("LOCAL_WORLD_SIZE", 0, hint=_LAUNCH_HINT) or None
    resolved = _device_for_rank(device, model, local_rank, local_world)
    return DistPlan(launch="env", world_size=world, rank=rank, local_rank=local_rank, device=resolved,
                    spawned=SPAWN_PARENT_ENV in os.environ, **_common(options))


def _device_for_rank(device: Any, model: Any, local_rank: int, local_world: int | None) -> Any:
    """This worker's device: the ``local_rank``-th listed one, the GPU numbered ``local_rank``, or the CPU."""
    if isinstance(device, (list, tuple)):
        if local_rank >= len(device):
            raise DriverError(
                f"device={list(device)!r} lists {len(device)} device(s) but this is local rank {local_rank}; list "
                "one device per process, or pass device='cuda' to give each process the GPU of its LOCAL_RANK."
            )
        item = device[local_rank]
        parsed = parse_device(item)
        return explicit_cuda(device, parsed) if parsed.type == "cuda" else flow.device("cpu", local_rank)
    parsed = parse_device(device, model)
    if parsed.type == "cpu":
        return flow.device("cpu", local_rank)  # oneflow numbers each local process's CPU by its local rank
    if parsed.index is None:
        return explicit_cuda(device, flow.device("cuda", local_rank))
    if (local_world or 2) > 1:
        raise DriverError(
            f"device={device!r} names one GPU, but several processes run on this machine and would all use it; "
            "pass device='cuda' (each process takes the GPU of its LOCAL_RANK) or a list such as device=[0, 1]."
        )
    return explicit_cuda(device, parsed)


def _check_devices(device: Any, nproc: int, model: Any) -> Any:
    """The device kind for ``nproc`` workers the supervisor starts: all CPU, or GPUs that exist."""
    items = list(device) if isinstance(device, (list, tuple)) else None
    if items is None or len(items) == 1:
        parsed = parse_device(items[0] if items else device, model)
        if parsed.type == "cpu":
            return flow.device("cpu")
        if parsed.index is not None:
            raise one_gpu_for_many(device, nproc, ONEFLOW_LAUNCH, spawn=True)
        explicit_cuda(device, flow.device("cuda", 0))
        check_enough_gpus(device, nproc, flow.cuda.device_count())
        return flow.device("cuda")
    parsed = [parse_device(item) for item in items]
    check_distinct_devices(items, [DeviceSlot("gpu" if d.type == "cuda" else "cpu", d.index, str(d)) for d in parsed])
    for d in parsed:
        explicit_cuda(items, d)
    if sorted(d.index for d in parsed) != list(range(len(parsed))):
        raise DriverError(
            f"device={items!r}: the workers the Trainer starts use GPUs 0..{len(parsed) - 1} by local rank; to use "
            "other GPUs, set CUDA_VISIBLE_DEVICES (e.g. CUDA_VISIBLE_DEVICES=2,3) and pass device='cuda'."
        )
    return flow.device("cuda")


def _ddp_kwargs(options: Mapping[str, Any]) -> dict[str, Any]:
    return wrapper_options(options, "ddp_kwargs", argument=ARGUMENT, wrapper="DistributedDataParallel",
                           accepted=DDP_OPTIONS, note=" oneflow 0.9's DistributedDataParallel has no other; "
                           "broadcast_parameters is always on: every process starts from rank 0's weights.")
