"""Which process layout a paddle Trainer asks for: decided once, from ``device=``, ``nproc=`` and the environment.

The ``launch`` of the plan, checked in this order:

- ``existing``: the user called ``paddle.distributed.init_parallel_env()`` (or
  ``fleet.init``) before building the Trainer; that parallel environment is used as is
  (and a model the user already wrapped in ``paddle.DataParallel`` is unwrapped);
- ``env``: ``python -m paddle.distributed.launch`` (or anything that sets
  ``PADDLE_TRAINER_ID``/``PADDLE_TRAINERS_NUM``/``PADDLE_TRAINER_ENDPOINTS``/
  ``PADDLE_CURRENT_ENDPOINT``) started this process as one of ``PADDLE_TRAINERS_NUM > 1``;
- ``spawned`` and ``spawn``: as in :class:`drivetrain.backend.DistPlan` (the Trainer starts the processes).

Only checks and arithmetic: no process group is created here, so a wrong combination fails in the first process.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

import paddle

from drivetrain.backend import DistPlan as _CorePlan
from drivetrain.backend import (
    DriverError,
    LauncherVars,
    bool_option,
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

from ._device import Device, model_device, resolve_device

SPAWN_STORE_ENV = "DRIVETRAIN_SPAWN_STORE"
"""``host:port`` of the store the parent of spawned processes hosts (start-up and exit notices)."""

DEFAULT_TIMEOUT = 30.0
GLOO_LIMIT = 30.0
"""paddle's gloo gives up on a collective after 30 s, a limit paddle does not let us change."""

DIST_KWARGS = {
    "fleet": "bool (default False): fleet collective mode, fleet.init(is_collective=True) and "
    "fleet.distributed_model/distributed_optimizer, instead of init_parallel_env and paddle.DataParallel",
    "strategy": "a paddle.distributed.fleet.DistributedStrategy for fleet.init (needs fleet=True; data "
    "parallelism only)",
    "timeout": "seconds (default 30): how long a collective waits for the other processes (the start-up "
    "at least 60 s); also the bound on how long a process outlives a failed or stuck peer. On CPU paddle's "
    "gloo gives up after 30 s whatever this says",
    "backend": "'gloo' or 'nccl' (default: gloo on CPU, nccl on GPUs)",
    "find_unused_parameters": "bool (default False): True all-reduces every trainable parameter's gradient, "
    "a zero one where a process did not use the parameter (needed when ranks use different parameters)",
    "even_batches": "bool (default False): True refuses a training set whose last global batch would be "
    "padded with repeated samples (use drop_last=True or a divisible size)",
    "spawn_output": "'inherit' (default) or 'prefix': output of the processes the Trainer starts; 'prefix' "
    "starts each of their lines with [rank N]",
}
BACKENDS = ("gloo", "nccl")
_OPTIONS = "paddle_kwargs"

LAUNCH_HINT = ("Start every process with paddle's launcher (python -m paddle.distributed.launch --nproc_per_node N "
               "--log_dir /tmp/paddle-logs train.py), which sets PADDLE_TRAINER_ID, PADDLE_TRAINERS_NUM, "
               "PADDLE_TRAINER_ENDPOINTS and PADDLE_CURRENT_ENDPOINT")
_LAUNCH_START = "python -m paddle.distributed.launch --nproc_per_node {n} train.py"
PADDLE_LAUNCH = LauncherVars(
    rank="PADDLE_TRAINER_ID", world_size="PADDLE_TRAINERS_NUM", local_rank=("PADDLE_LOCAL_RANK", "PADDLE_RANK_IN_NODE"),
    local_world_size="PADDLE_LOCAL_SIZE", hint=LAUNCH_HINT, start=_LAUNCH_START,
    needed_when_many=("PADDLE_TRAINER_ENDPOINTS", "PADDLE_CURRENT_ENDPOINT"), rank_word="the id",
    local_rank_word="the local rank", gpu="gpu",
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class DistPlan(_CorePlan):
    """One process's place in a distributed run (``launch``: see the module docstring) and its options.

    ``master`` is the (address, port) of the process group's store (``env``, ``spawned``, ``existing``).
    """

    device: Device
    fleet: bool
    strategy: Any
    find_unused_parameters: bool
    spawn_store: tuple[str, int] | None = None
    """(address, port) of the store the parent of spawned processes hosts (``spawned`` only)."""
    gpus: tuple[int, ...] | None = None
    """The GPU of each rank, for the processes this one starts (``spawn`` on GPUs only)."""


@dataclasses.dataclass(frozen=True)
class _Env:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master: tuple[str, int] | None
    backend: str | None
    spawn_store: tuple[str, int] | None


def plan_distributed(model: Any, device: Any, nproc: Any, options: Mapping[str, Any]) -> DistPlan | None:
    """The distributed layout asked for, or None for one process (the single-device driver)."""
    listed = check_layout_arguments(nproc, device)
    inner = model._layers if isinstance(model, paddle.DataParallel) else model
    if paddle.distributed.is_initialized():
        return _existing_plan(model, inner, device, nproc, options)
    if inner is not model:
        raise DriverError(
            "model is a paddle.DataParallel but the parallel environment is not initialised in this process; "
            "pass the bare model (drivetrain wraps it), or call paddle.distributed.init_parallel_env() before "
            "wrapping it."
        )
    env = read_env()
    if env is not None and (env.world_size > 1 or env.spawn_store is not None):
        check_launched_layout(nproc, device, env, PADDLE_LAUNCH)
        return _make_plan("spawned" if env.spawn_store is not None else "env", model, device, env.rank,
                          env.world_size, env.local_rank, env.local_world_size, options, env.master,
                          backend=env.backend, spawn_store=env.spawn_store)
    wanted = processes_wanted(nproc, device)
    if env is not None and wanted > 1:  # a launcher started a single process, but more were asked for
        check_process_count(wanted, env.world_size, "PADDLE_TRAINERS_NUM", start=_LAUNCH_START)
    if wanted == 1:
        return None
    if listed and len(device) == 1:
        device = device[0]
    if listed:
        _check_device_list(device)
    else:
        _check_spawn_device(device, wanted, model)
    return _make_plan("spawn", model, device, 0, wanted, 0, wanted, options, None)


# ----------------------------------------------------------------------------- layouts
def _existing_plan(model: Any, inner: Any, device: Any, nproc: Any, options: Mapping[str, Any]) -> DistPlan:
    from paddle import distributed as dist

    world, rank = dist.get_world_size(), dist.get_rank()
    check_process_count(nproc, world, "the world size of the parallel environment you initialised",
                        start=_LAUNCH_START)
    for key in ("timeout", "backend", "fleet", "strategy"):
        if key in options:
            raise DriverError(
                f"paddle_kwargs[{key!r}] applies when drivetrain initialises the parallel environment, but "
                "paddle.distributed.init_parallel_env (or fleet.init) was already called; remove it."
            )
    env = read_env()
    local_rank = env.local_rank if env is not None else rank
    local_world = env.local_world_size if env is not None else world
    if device is None:
        device = "gpu" if model_device(inner).kind == "gpu" else "cpu"
    from paddle.distributed.collective import _get_global_group

    backend = _backend_of(_get_global_group())
    master = env.master if env is not None else None
    return _make_plan("existing", inner, device, rank, world, local_rank, local_world, options, master,
                      backend=backend)


def _backend_of(group: Any) -> str:
    name = type(getattr(group, "process_group", None)).__name__.lower()
    return "nccl" if "nccl" in name else "gloo"


def _make_plan(launch: str, model: Any, device: Any, rank: int, world: int, local_rank: int, local_world: int,
               options: Mapping[str, Any], master: tuple[str, int] | None, *, backend: str | None = None,
               spawn_store: tuple[str, int] | None = None) -> DistPlan:
    resolved = _device_for_rank(device, model, local_rank, local_world)
    if backend == "auto":
        backend = None
    backend = choice_option(options, "backend", BACKENDS, backend, argument=_OPTIONS)
    if backend is None:
        backend = "nccl" if resolved.kind == "gpu" else "gloo"
    if backend == "nccl" and resolved.kind != "gpu":
        raise DriverError(
            f"the backend is 'nccl', which needs GPUs, but device={device!r} puts this process on {resolved}; "
            "use the 'gloo' backend on CPU (the default there) or pass GPU devices."
        )
    if backend == "gloo" and resolved.kind == "gpu":
        raise DriverError(
            f"the backend is 'gloo' but device={device!r} puts this process on {resolved}; paddle's gloo "
            "process group runs on the CPU only: use 'nccl' with GPUs (the default there)."
        )
    fleet = bool_option(options, "fleet", False, argument=_OPTIONS)
    strategy = options.get("strategy")
    if strategy is not None:
        _check_strategy(strategy, fleet)
    gpus = None
    if launch == "spawn" and resolved.kind == "gpu":
        listed = isinstance(device, (list, tuple))
        gpus = tuple(d.index for d in _check_device_list(device)) if listed else tuple(range(world))
    return DistPlan(
        launch=launch, world_size=world, rank=rank, local_rank=local_rank, device=resolved, backend=backend,
        **plan_options(options, default_timeout=DEFAULT_TIMEOUT, argument=_OPTIONS), fleet=fleet, strategy=strategy,
        find_unused_parameters=bool_option(options, "find_unused_parameters", False, argument=_OPTIONS),
        master=master, spawn_store=spawn_store, gpus=gpus,
    )


def _check_strategy(strategy: Any, fleet: bool) -> None:
    from paddle.distributed import fleet as paddle_fleet

    if not isinstance(strategy, paddle_fleet.DistributedStrategy):
        raise DriverError(
            f"paddle_kwargs['strategy']={strategy!r:.80} is not a paddle.distributed.fleet.DistributedStrategy."
        )
    if not fleet:
        raise DriverError("paddle_kwargs['strategy'] configures fleet; add 'fleet': True (or remove the strategy).")
    configs = strategy.hybrid_configs
    other = {name: configs.get(name, 1) for name in ("mp_degree", "pp_degree", "sharding_degree", "sep_degree")}
    other = {name: value for name, value in other.items() if value not in (1, -1)}
    if other:
        raise DriverError(
            f"paddle_kwargs['strategy'] asks for {other}; drivetrain's paddle driver does data parallelism only "
            "(every process holds the whole model). Leave the model, pipeline, sharding and sep degrees at 1."
        )


# ---------------------------------------------------------------------- environment
def _env_int(name: str, default: int | None = None) -> int:
    return env_int(name, default, hint=LAUNCH_HINT)


def _address(text: str, name: str) -> tuple[str, int]:
    host, _, port = text.strip().rpartition(":")
    if not host or not port.isdigit():
        raise DriverError(f"the environment variable {name}={text!r} is not host:port. {LAUNCH_HINT}.")
    return host, int(port)


def read_env() -> _Env | None:
    """paddle's launcher variables of this process, or None when neither PADDLE_TRAINER_ID nor
    PADDLE_TRAINERS_NUM is set."""
    launched = read_launcher_env(PADDLE_LAUNCH)
    if launched is None:
        return None
    rank, world, local_rank, local_world = (launched.rank, launched.world_size, launched.local_rank,
                                            launched.local_world_size)
    master = None
    if world > 1:
        endpoints = os.environ["PADDLE_TRAINER_ENDPOINTS"].split(",")
        if len(endpoints) != world:
            raise DriverError(
                f"PADDLE_TRAINER_ENDPOINTS lists {len(endpoints)} endpoint(s) but PADDLE_TRAINERS_NUM={world}; "
                f"list one host:port per process. {LAUNCH_HINT}."
            )
        master = master_address(endpoints)
    spawn_store = None
    if SPAWN_STORE_ENV in os.environ:
        spawn_store = _address(os.environ[SPAWN_STORE_ENV], SPAWN_STORE_ENV)
    return _Env(rank, world, local_rank, local_world, master, os.environ.get("PADDLE_DISTRI_BACKEND"), spawn_store)


def master_address(endpoints: list[str] | None = None) -> tuple[str, int]:
    """Where paddle's process-group store listens: the same order of variables init_parallel_env reads."""
    if endpoints is None:
        endpoints = os.environ.get("PADDLE_TRAINER_ENDPOINTS", "").split(",")
    if os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT"):
        return os.environ["MASTER_ADDR"], _env_int("MASTER_PORT")
    if os.environ.get("PADDLE_MASTER"):
        return _address(os.environ["PADDLE_MASTER"], "PADDLE_MASTER")
    return _address(endpoints[0], "PADDLE_TRAINER_ENDPOINTS")


# ---------------------------------------------------------------------------- devices
def _any_gpu(device: Any) -> bool:
    return isinstance(device, str) and device.strip().lower() in ("gpu", "cuda")


def _gpu_count() -> int:
    return paddle.device.cuda.device_count() if paddle.is_compiled_with_cuda() else 0


def _device_for_rank(device: Any, model: Any, local_rank: int, local_world: int) -> Device:
    """This process's device: the ``local_rank``-th listed one, or the GPU numbered ``local_rank``."""
    if isinstance(device, (list, tuple)):
        return _check_device_list(device)[local_rank]
    if device is None:
        device = "gpu" if model_device(model).kind == "gpu" else "cpu"
    if _any_gpu(device):
        selected = os.environ.get("FLAGS_selected_gpus", "")
        if selected.isdigit():  # paddle's launcher gives each process its GPU
            return resolve_device(int(selected), model)
        return resolve_device(local_rank, model)
    resolved = resolve_device(device, model)
    if resolved.kind == "gpu" and local_world > 1:
        raise one_gpu_for_many(device, local_world, PADDLE_LAUNCH, spawn=False)
    return resolved


def _check_spawn_device(device: Any, nproc: int, model: Any) -> None:
    """``device`` with ``nproc`` processes started by the Trainer: one CPU each, or GPUs 0..nproc-1."""
    if device is None:
        device = "gpu" if model_device(model).kind == "gpu" else "cpu"
    if _any_gpu(device):
        resolve_device(device, model)  # says why a GPU cannot be used
        count = _gpu_count()
        if nproc > count:
            raise DriverError(
                f"nproc={nproc} with device={device!r} needs {nproc} GPUs (one per process) but this machine has "
                f"{count}; pass nproc={count} or less, or device='cpu' to train with CPU processes."
            )
        return
    if resolve_device(device, model).kind == "gpu":
        raise one_gpu_for_many(device, nproc, PADDLE_LAUNCH, spawn=True)


def _check_device_list(devices: Any) -> list[Device]:
    """One distinct device per process, all CPU or all existing GPUs."""
    given = f"device={list(devices)!r}"
    parsed = []
    for item in devices:
        if item is None or isinstance(item, (list, tuple)):
            raise DriverError(f"{given}: {item!r} is not a device; list GPU indices ([0, 1]) or 'gpu:N' strings.")
        try:
            parsed.append(resolve_device(item, None))
        except DriverError as exc:
            raise DriverError(f"{given}: {exc}") from None
    kinds = {d.kind for d in parsed}
    if len(kinds) > 1:
        raise DriverError(f"{given} mixes the CPU and GPUs; list only GPUs, or use device='cpu' with nproc=N.")
    if "cpu" in kinds and len(parsed) > 1:
        raise DriverError(
            f"{given} lists the CPU {len(parsed)} times; to train with {len(parsed)} CPU processes pass "
            f"device='cpu', nproc={len(parsed)}."
        )
    names = [d.name for d in parsed]
    for name in names:
        if names.count(name) > 1:
            raise DriverError(f"{given} lists {name} more than once; one process runs per listed GPU: list each once.")
    return parsed
