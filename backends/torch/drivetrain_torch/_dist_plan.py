"""Which process layout a torch Trainer asks for: decided once, from ``device=``, ``nproc=`` and the environment.

The ``launch`` of the plan, checked in this order:

- ``existing``: the user called ``torch.distributed.init_process_group`` (and maybe
  wrapped the model in DDP) before building the Trainer; that group is used as is;
- ``env``: ``torchrun`` (or anything that sets ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/
  ``MASTER_PORT``) started this process as one of ``WORLD_SIZE > 1``;
- ``spawned`` and ``spawn``: as in :class:`drivetrain.backend.DistPlan` (the Trainer starts the processes).

Only checks and arithmetic: no process group is created here, so a wrong combination fails in the first process.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from collections.abc import Mapping
from typing import Any

import torch

from drivetrain.backend import (
    SPAWN_PARENT_ENV,
    DriverError,
    LauncherVars,
    check_launched_layout,
    check_layout_arguments,
    check_process_count,
    choice_option,
    env_int,
    one_gpu_for_many,
    plan_options,
    processes_wanted,
    read_launcher_env,
)
from drivetrain.backend import DistPlan as _CorePlan

from ._device import model_device, resolve_device

DEFAULT_TIMEOUT = 60.0

DIST_KWARGS = {
    "timeout": "seconds (default 60): how long a collective waits for the other processes (the start-up at "
    "least 60 s); also the bound on how long a process outlives a failed or stuck peer",
    "ddp_kwargs": "dict passed to torch.nn.parallel.DistributedDataParallel (e.g. find_unused_parameters=True)",
    "backend": "'gloo' or 'nccl' (default: gloo on CPU, nccl on CUDA)",
    "even_batches": "bool (default False): True refuses a training set whose last global batch would be "
    "padded with repeated samples (use drop_last=True or a divisible size)",
    "spawn_output": "'inherit' (default) or 'prefix': output of the processes the Trainer starts; 'prefix' "
    "starts each of their lines with [rank N]",
}
BACKENDS = ("gloo", "nccl")
_OPTIONS = "torch_kwargs"
_DDP_RESERVED = ("module", "device_ids", "output_device", "process_group")

_TORCHRUN_HINT = ("Start every process with torchrun (torchrun --nproc_per_node N train.py), which sets RANK, "
                  "WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT")
_TORCHRUN_START = "torchrun --nproc_per_node {n} train.py"
TORCHRUN = LauncherVars(rank="RANK", world_size="WORLD_SIZE", local_rank=("LOCAL_RANK",),
                        local_world_size="LOCAL_WORLD_SIZE", hint=_TORCHRUN_HINT, start=_TORCHRUN_START,
                        needed_when_many=("MASTER_ADDR", "MASTER_PORT"))


@dataclasses.dataclass(frozen=True, kw_only=True)
class DistPlan(_CorePlan):
    """One process's place in a distributed run (``launch``: see the module docstring) and its options.

    ``master`` is the (address, port) of the rendezvous store for ``env``/``spawned``.
    """

    device: torch.device
    ddp_kwargs: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class _Env:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master: tuple[str, int] | None
    spawned: bool


def plan_distributed(model: Any, device: Any, nproc: Any, options: Mapping[str, Any]) -> DistPlan | None:
    """The distributed layout asked for, or None for one process (the single-device driver)."""
    listed = check_layout_arguments(nproc, device)
    from torch import distributed as dist

    if dist.is_available() and dist.is_initialized():
        return _existing_plan(model, device, nproc, options)
    env = _read_env()
    if env is not None and (env.world_size > 1 or env.spawned):
        check_launched_layout(nproc, device, env, TORCHRUN)
        return _make_plan("spawned" if env.spawned else "env", model, device, env.rank, env.world_size,
                          env.local_rank, env.local_world_size, options, env.master)
    wanted = processes_wanted(nproc, device)
    if env is not None and wanted > 1:  # torchrun with a single process, but more were asked for
        check_process_count(wanted, env.world_size, "WORLD_SIZE", start=_TORCHRUN_START)
    if wanted == 1:
        return None
    if listed and len(device) == 1:
        device = device[0]
    if listed:
        _check_device_list(device)
    else:
        _check_spawn_device(device, wanted, model)
    if not dist.is_available():
        raise DriverError(
            f"distributed training (device={device!r}, nproc={nproc!r}) needs torch.distributed, which this "
            f"torch build ({torch.__version__}) does not include; train in one process."
        )
    return _make_plan("spawn", model, device, 0, wanted, 0, wanted, options, None)


# ----------------------------------------------------------------------------- layouts
def _existing_plan(model: Any, device: Any, nproc: Any, options: Mapping[str, Any]) -> DistPlan:
    from torch import distributed as dist

    world, rank = dist.get_world_size(), dist.get_rank()
    check_process_count(nproc, world, "the world size of the process group you initialised", start=_TORCHRUN_START)
    for key in ("timeout", "backend"):
        if key in options:
            raise DriverError(
                f"torch_kwargs[{key!r}] applies when drivetrain creates the process group, but "
                "torch.distributed.init_process_group was already called; pass it there instead, or remove it."
            )
    local_rank = _env_int("LOCAL_RANK", rank)
    local_world = _env_int("LOCAL_WORLD_SIZE", world)
    inner = model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model
    if device is None:
        device = _default_device_of(inner)
    plan = _make_plan("existing", inner, device, rank, world, local_rank, local_world, options, None,
                      backend=str(dist.get_backend()))
    if inner is not model:
        where = model_device(inner)
        if where.type != plan.device.type or (where.type == "cuda" and where.index != plan.device.index):
            raise DriverError(
                f"the model is a DistributedDataParallel on {where} but device={device!r} means {plan.device} "
                f"for this process; pass device=None (use the model's device) or device='{where}'."
            )
    return plan


def _make_plan(launch: str, model: Any, device: Any, rank: int, world: int, local_rank: int, local_world: int,
               options: Mapping[str, Any], master: tuple[str, int] | None, backend: str | None = None) -> DistPlan:
    resolved = _device_for_rank(device, model, local_rank, local_world)
    if backend is None:
        backend = choice_option(options, "backend", BACKENDS, "nccl" if resolved.type == "cuda" else "gloo",
                                argument=_OPTIONS)
    if backend == "nccl" and resolved.type != "cuda":
        raise DriverError(
            f"the process group backend is 'nccl', which needs CUDA devices, but device={device!r} puts this "
            f"process on {resolved}; use the 'gloo' backend on CPU (the default there) or pass GPU devices."
        )
    return DistPlan(
        launch=launch, world_size=world, rank=rank, local_rank=local_rank, device=resolved, backend=backend,
        **plan_options(options, default_timeout=DEFAULT_TIMEOUT, argument=_OPTIONS), ddp_kwargs=_ddp_kwargs(options),
        master=master,
    )


# ---------------------------------------------------------------------- environment
def _env_int(name: str, default: int | None = None) -> int:
    return env_int(name, default, hint=_TORCHRUN_HINT)


def _read_env() -> _Env | None:
    """The torchrun-style variables of this process, or None when neither RANK nor WORLD_SIZE is set."""
    env = read_launcher_env(TORCHRUN)
    if env is None:
        return None
    master = (os.environ["MASTER_ADDR"], _env_int("MASTER_PORT")) if env.world_size > 1 else None
    return _Env(env.rank, env.world_size, env.local_rank, env.local_world_size, master,
                SPAWN_PARENT_ENV in os.environ)


# ---------------------------------------------------------------------------- devices
def _default_device_of(model: Any) -> str:
    return "cuda" if model_device(model).type == "cuda" else "cpu"


def _device_for_rank(device: Any, model: Any, local_rank: int, local_world: int) -> torch.device:
    """This process's device: the ``local_rank``-th listed one, or the GPU numbered ``local_rank``."""
    if isinstance(device, (list, tuple)):
        _check_device_list(device)
        return _parse_listed(device[local_rank], device)
    if device is None:
        device = _default_device_of(model)
    if _any_gpu(device) and torch.cuda.is_available():
        return _cuda(local_rank, device, local_world)
    resolved = resolve_device(device, model)  # also says why a GPU cannot be used
    if resolved.type == "cpu":
        return resolved
    if local_world > 1:
        raise one_gpu_for_many(device, local_world, TORCHRUN, spawn=False)
    return resolved


def _any_gpu(device: Any) -> bool:
    """``'cuda'``, ``'gpu'`` or ``torch.device('cuda')``: a GPU without saying which one."""
    if isinstance(device, torch.device):
        return device.type == "cuda" and device.index is None
    return isinstance(device, str) and device.strip().lower() in ("cuda", "gpu")


def _cuda(index: int, given: Any, processes: int) -> torch.device:
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if index >= count:
        raise DriverError(
            f"device={given!r} with {processes} processes gives each process its own GPU, but this machine has "
            f"{count} visible CUDA device(s); start at most {count} process(es) (nproc / --nproc_per_node), "
            "or check CUDA_VISIBLE_DEVICES."
        )
    return torch.device("cuda", index)


def _check_spawn_device(device: Any, nproc: int, model: Any) -> None:
    """``device`` with ``nproc`` processes started by the Trainer: one CPU each, or GPUs 0..nproc-1."""
    if device is None:
        device = _default_device_of(model)
    if not (_any_gpu(device) and torch.cuda.is_available()):
        resolved = resolve_device(device, model)  # also says why a GPU cannot be used
        if resolved.type == "cpu":
            return
        raise one_gpu_for_many(device, nproc, TORCHRUN, spawn=True)
    count = torch.cuda.device_count()
    if nproc > count:
        raise DriverError(
            f"nproc={nproc} with device={device!r} needs {nproc} GPUs (one per process) but this machine has "
            f"{count} visible CUDA device(s); pass nproc={count} or less, or device='cpu' to train on CPU processes."
        )


def _parse_listed(item: Any, devices: Any) -> torch.device:
    given = f"device={list(devices)!r}"
    if isinstance(item, bool) or not isinstance(item, (int, str, torch.device)):
        raise DriverError(
            f"{given}: {item!r} is not a device; list GPU indices ([0, 1]), 'cuda:N' strings or torch.devices."
        )
    if isinstance(item, int):
        if item < 0:
            raise DriverError(f"{given}: GPU index {item} must be >= 0.")
        return torch.device("cuda", item)
    text = item.strip().lower() if isinstance(item, str) else str(item)
    if text == "gpu" or text.startswith("gpu:"):
        text = "cuda" + text[3:]
    try:
        parsed = torch.device(text)
    except (RuntimeError, ValueError):
        raise DriverError(f"{given}: {item!r} is not a device torch understands; list GPU indices such as [0, 1].") from None
    if parsed.type not in ("cpu", "cuda"):
        raise DriverError(f"{given}: {item!r} is a {parsed.type!r} device; the torch driver supports cpu and cuda.")
    if parsed.type == "cuda" and parsed.index is None:
        raise DriverError(f"{given}: {item!r} has no GPU index; list explicit GPUs such as [0, 1] or 'cuda:0'.")
    return parsed


def _check_device_list(devices: Any) -> None:
    """One distinct device per process, all CPU or all existing GPUs."""
    given = f"device={list(devices)!r}"
    parsed = [_parse_listed(item, devices) for item in devices]
    kinds = {d.type for d in parsed}
    if len(kinds) > 1:
        raise DriverError(f"{given} mixes CPU and GPUs; list only GPUs, or use device='cpu' with nproc=N.")
    seen: set[torch.device] = set()
    for d in parsed:
        if d in seen:
            hint = ("device='cpu', nproc=N starts N CPU processes" if d.type == "cpu"
                    else "list each GPU once, e.g. [0, 1]")
            raise DriverError(f"{given} lists {d} more than once; one process runs per listed device: {hint}.")
        seen.add(d)
    if "cpu" in kinds:
        return
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


# ---------------------------------------------------------------------------- options
def _ddp_kwargs(options: Mapping[str, Any]) -> dict[str, Any]:
    value = options.get("ddp_kwargs") or {}
    if not isinstance(value, Mapping):
        raise DriverError(f"torch_kwargs['ddp_kwargs']={value!r} must be a dict of DistributedDataParallel options.")
    accepted = [name for name in inspect.signature(torch.nn.parallel.DistributedDataParallel.__init__).parameters
                if name not in ("self", *_DDP_RESERVED)]
    for key in value:
        if key in _DDP_RESERVED:
            raise DriverError(
                f"torch_kwargs['ddp_kwargs'][{key!r}] is set by drivetrain from device= and the process group; "
                "remove it."
            )
        if key not in accepted:
            raise DriverError(
                f"torch_kwargs['ddp_kwargs'][{key!r}] is not a DistributedDataParallel option; accepted: {accepted}."
            )
    return dict(value)
