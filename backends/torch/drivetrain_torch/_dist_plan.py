"""Which process layout a torch Trainer asks for: decided once, from ``device=``, ``nproc=`` and the environment.

The plan's ``launch`` is ``existing`` when the user called
``torch.distributed.init_process_group`` (and maybe wrapped the model in DDP) before
building the Trainer: that group is used as is. Otherwise
:meth:`drivetrain.backend.DeviceRules.launch` decides, with torch's device calls
(``DEVICES``); ``env`` there means that ``torchrun`` (or anything that sets ``RANK``,
``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``) started this process as one of
``WORLD_SIZE > 1``.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping
from typing import Any

import torch

from drivetrain.backend import (
    LAUNCH_OPTION_DOCS,
    DeviceRules,
    DriverError,
    LauncherEnv,
    LauncherVars,
    check_layout_arguments,
    check_process_count,
    choice_option,
    env_int,
    env_master,
    plan_options,
    process_group_backend,
    read_launcher_env,
    refuse_late_options,
    torchrun_variables,
    wrapper_options,
)
from drivetrain.backend import DistPlan as _CorePlan

from ._device import model_device, parse_device, resolve_device

DEFAULT_TIMEOUT = 60.0

DIST_KWARGS = {
    "timeout": "seconds (default 60): how long a collective waits for the other processes (the start-up at "
    "least 60 s); also the bound on how long a process outlives a failed or stuck peer",
    "ddp_kwargs": "dict passed to torch.nn.parallel.DistributedDataParallel (e.g. find_unused_parameters=True)",
    "backend": "'gloo' or 'nccl' (default: gloo on CPU, nccl on CUDA)",
    **LAUNCH_OPTION_DOCS,
}
_OPTIONS = "torch_kwargs"
_DDP_RESERVED = ("module", "device_ids", "output_device", "process_group")

_TORCHRUN_HINT = ("Start every process with torchrun (torchrun --nproc_per_node N train.py), which sets RANK, "
                  "WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT")
TORCHRUN = LauncherVars(rank="RANK", world_size="WORLD_SIZE", local_rank=("LOCAL_RANK",),
                        local_world_size="LOCAL_WORLD_SIZE", hint=_TORCHRUN_HINT,
                        start="torchrun --nproc_per_node {n} train.py", needed_when_many=("MASTER_ADDR", "MASTER_PORT"),
                        from_slurm=torchrun_variables)


@dataclasses.dataclass(frozen=True, kw_only=True)
class DistPlan(_CorePlan):
    """One process's place in a distributed run (``launch``: see the module docstring) and its options.

    ``master`` is the (address, port) of the rendezvous store for ``env``/``spawned``.
    """

    device: torch.device
    ddp_kwargs: dict[str, Any]


@dataclasses.dataclass(frozen=True, kw_only=True)
class ShardedPlan(DistPlan):
    """The plan of a driver whose engine shards the model (FSDP, ZeRO): ``state_dict`` says how checkpoints are
    written, ``"sharded"`` (every rank its own pieces) or ``"full"`` (gathered, rank 0 writes one file)."""

    ddp_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    state_dict: str = "sharded"


def plan_distributed(model: Any, device: Any, nproc: Any, options: Mapping[str, Any]) -> DistPlan | None:
    """The distributed layout asked for, or None for one process (the single-device driver)."""
    check_layout_arguments(nproc, device)
    from torch import distributed as dist

    if dist.is_available() and dist.is_initialized():
        return _existing_plan(model, device, nproc, options)
    launch = DEVICES.launch(nproc, device, read_launcher_env(TORCHRUN), model)
    if launch is None:
        return None
    if launch[0] == "spawn" and not dist.is_available():
        raise DriverError(
            f"distributed training (device={device!r}, nproc={nproc!r}) needs torch.distributed, which this "
            f"torch build ({torch.__version__}) does not include; train in one process."
        )
    return _make_plan(*launch, model, options)


# ----------------------------------------------------------------------------- layouts
def existing_group(nproc: Any, options: Mapping[str, Any], argument: str) -> tuple[LauncherEnv, str]:
    """This process's place and the backend of the process group the user initialised, checked against ``nproc``
    (options that only apply when drivetrain starts the group are refused under ``argument``)."""
    from torch import distributed as dist

    world, rank = dist.get_world_size(), dist.get_rank()
    check_process_count(nproc, world, "the world size of the process group you initialised", start=TORCHRUN.start)
    refuse_late_options(options, ("timeout", "backend"), argument=argument,
                        initialised="torch.distributed.init_process_group")
    env = LauncherEnv(rank, world, _env_int("LOCAL_RANK", rank), _env_int("LOCAL_WORLD_SIZE", world))
    return env, str(dist.get_backend())


def wrapper_layout(model: Any, device: Any, nproc: Any, options: Mapping[str, Any], *, argument: str,
                   wraps_itself: str) -> tuple[str, Any, LauncherEnv, str | None]:
    """``(launch, device, env, backend)`` for a driver that wraps the bare module itself (FSDP, an engine): the
    group the user initialised, the launcher's layout, or one process (``"single"``: a world of one, whose group
    the driver starts itself). A DistributedDataParallel model is refused with ``wraps_itself`` (what the driver
    does instead, and the fix)."""
    check_layout_arguments(nproc, device)
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        raise DriverError(wraps_itself)
    from torch import distributed as dist

    if dist.is_available() and dist.is_initialized():
        env, backend = existing_group(nproc, options, argument)
        return "existing", DEVICES.default(model) if device is None else device, env, backend
    launch = DEVICES.launch(nproc, device, read_launcher_env(TORCHRUN), model)
    if launch is None:
        return "single", device[0] if isinstance(device, (list, tuple)) else device, LauncherEnv(0, 1, 0, 1), None
    return (*launch, None)


def plan_fields(launch: str, device: Any, env: LauncherEnv, model: Any, options: Mapping[str, Any], *,
                argument: str, backend: str | None = None) -> dict[str, Any]:
    """The fields every torch distributed plan has (DDP's and FSDP's): device, backend, rendezvous, options."""
    master = env_master(hint=_TORCHRUN_HINT) if launch in ("env", "spawned") else None
    resolved = DEVICES.for_rank(device, model, env.local_rank, env.local_world_size)
    if backend is None:
        backend = process_group_backend(options, argument=argument, on_gpu=resolved.type == "cuda", device=device,
                                        where=resolved)
    return {"launch": launch, "world_size": env.world_size, "rank": env.rank, "local_rank": env.local_rank,
            "device": resolved, "backend": backend, "master": master,
            **plan_options(options, default_timeout=DEFAULT_TIMEOUT, argument=argument)}


def sharded_plan_fields(model: Any, device: Any, nproc: Any, options: Mapping[str, Any], *, argument: str,
                        wraps_itself: str) -> dict[str, Any]:
    """The :class:`ShardedPlan` fields of this rank for a driver that shards the bare module itself: its layout
    (:func:`wrapper_layout`), :func:`plan_fields`, and ``argument['state_dict']``."""
    launch, where, env, backend = wrapper_layout(model, device, nproc, options, argument=argument,
                                                 wraps_itself=wraps_itself)
    fields = plan_fields(launch, where, env, model, options, argument=argument, backend=backend)
    return {**fields, "state_dict": choice_option(options, "state_dict", ("sharded", "full"), "sharded",
                                                  argument=argument)}


def _existing_plan(model: Any, device: Any, nproc: Any, options: Mapping[str, Any]) -> DistPlan:
    env, backend = existing_group(nproc, options, _OPTIONS)
    inner = model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model
    if device is None:
        device = DEVICES.default(inner)
    plan = _make_plan("existing", device, env, inner, options, backend=backend)
    if inner is not model:
        where = model_device(inner)
        if where.type != plan.device.type or (where.type == "cuda" and where.index != plan.device.index):
            raise DriverError(
                f"the model is a DistributedDataParallel on {where} but device={device!r} means {plan.device} "
                f"for this process; pass device=None (use the model's device) or device='{where}'."
            )
    return plan


def _make_plan(launch: str, device: Any, env: LauncherEnv, model: Any, options: Mapping[str, Any],
               backend: str | None = None) -> DistPlan:
    return DistPlan(
        **plan_fields(launch, device, env, model, options, argument=_OPTIONS, backend=backend),
        ddp_kwargs=wrapper_options(options, "ddp_kwargs", argument=_OPTIONS, wrapper="DistributedDataParallel",
                                   accepted=_ddp_accepted(), reserved=_DDP_RESERVED),
    )


def _ddp_accepted() -> list[str]:
    names = inspect.signature(torch.nn.parallel.DistributedDataParallel.__init__).parameters
    return [name for name in names if name not in ("self", *_DDP_RESERVED)]


# ---------------------------------------------------------------------- environment
def _env_int(name: str, default: int | None = None) -> int:
    return env_int(name, default, hint=_TORCHRUN_HINT)


# ---------------------------------------------------------------------------- devices
def _cuda(given: Any, model: Any, index: int, processes: int) -> torch.device:
    """GPU ``index`` for "any GPU" ``given`` with ``processes`` on this machine, where it exists."""
    count = torch.cuda.device_count()
    if index >= count:
        raise DriverError(
            f"device={given!r} with {processes} processes gives each process its own GPU, but this machine has "
            f"{count} visible CUDA device(s); start at most {count} process(es) (nproc / --nproc_per_node), "
            "or check CUDA_VISIBLE_DEVICES."
        )
    return torch.device("cuda", index)


def _parse_listed(item: Any, given: str) -> torch.device:
    """One entry of a device list: the rules of ``device=`` (:func:`._device.parse_device`), the error prefixed by the
    whole list (a GPU without its index is refused with the list, by the core)."""
    if isinstance(item, bool) or not isinstance(item, (int, str, torch.device)):
        raise DriverError(
            f"{given}: {item!r} is not a device; list GPU indices ([0, 1]), 'cuda:N' strings or torch.devices."
        )
    try:
        return parse_device(item)
    except DriverError as exc:
        raise DriverError(f"{given}: {exc}") from None


def _check_listed(parsed: list[torch.device], given: str) -> None:
    """The listed CUDA GPUs exist."""
    if not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU-only"
        raise DriverError(
            f"{given} asks for CUDA GPUs but torch.cuda.is_available() is False (this torch build is {build}, "
            f"torch {torch.__version__}, or no GPU is visible); use device='cpu', nproc={len(parsed)} to train "
            "with CPU processes."
        )
    count = torch.cuda.device_count()
    absent = [d.index for d in parsed if d.index >= count]
    if absent:
        valid = ", ".join(str(i) for i in range(count))
        raise DriverError(
            f"{given}: GPU(s) {absent} do not exist; this process sees {count} CUDA device(s) (valid indices: "
            f"{valid}). Check CUDA_VISIBLE_DEVICES."
        )


DEVICES = DeviceRules(names=TORCHRUN, model_device=model_device, resolve=resolve_device,
                      on_gpu=lambda d: d.type == "cuda",
                      gpu_count=lambda: torch.cuda.device_count() if torch.cuda.is_available() else 0,
                      gpu_for_rank=_cuda, parse_listed=_parse_listed, check_listed=_check_listed)
