"""Which process layout a paddle Trainer asks for: decided once, from ``device=``, ``nproc=`` and the environment.

The plan's ``launch`` is ``existing`` when the user called
``paddle.distributed.init_parallel_env()`` (or ``fleet.init``) before building the Trainer:
that parallel environment is used as is, and a model the user already wrapped in
``paddle.DataParallel`` is unwrapped. Otherwise :meth:`drivetrain.backend.DeviceRules.launch`
decides, with paddle's device calls (``DEVICES``); ``env`` there means that
``python -m paddle.distributed.launch`` (or anything that sets ``PADDLE_TRAINER_ID``,
``PADDLE_TRAINERS_NUM``, ``PADDLE_TRAINER_ENDPOINTS`` and ``PADDLE_CURRENT_ENDPOINT``)
started this process as one of ``PADDLE_TRAINERS_NUM > 1``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

import paddle

from drivetrain.backend import (
    LAUNCH_OPTION_DOCS,
    DeviceRules,
    DriverError,
    LauncherEnv,
    LauncherVars,
    SlurmStep,
    bool_option,
    check_layout_arguments,
    check_process_count,
    choice_option,
    env_address,
    env_master,
    plan_options,
    process_group_backend,
    read_launcher_env,
    refuse_late_options,
)
from drivetrain.backend import DistPlan as _CorePlan

from ._device import Device, model_device, resolve_device

SPAWN_STORE_ENV = "DRIVETRAIN_SPAWN_STORE"
"""The folder of the store the parent of spawned processes made (start-up and exit notices; a
:class:`drivetrain.backend.FolderStore`: paddle's own store would listen on every interface)."""

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
    "overlap": "bool (default True with nccl, False with gloo): True all-reduces the gradients in DataParallel's "
    "reducer during backward (as torch DDP does); False once per step, after backward. With gloo a peer killed "
    "during backward makes paddle abort the survivor unnamed (see docs/backends/paddle.md)",
    "sharding": "'os', 'os_g' or 'p_g_os' (default None: data parallelism): paddle's group sharding "
    "(paddle.distributed.sharding.group_sharded_parallel) splits the optimizer state ('os'), also the gradients "
    "('os_g'), also the parameters ('p_g_os') over the processes; GPUs (or XPUs) only",
    **LAUNCH_OPTION_DOCS,
}
_OPTIONS = "paddle_kwargs"
SHARDING_LEVELS = ("os", "os_g", "p_g_os")
_PADDLE_SHARDING_REASON = "group_sharded_parallel only support gpu, xpu and custom_device now"
"""What paddle 3.3 asserts on a CPU (quoted when it cannot be asked: this process's paddle device is not the CPU)."""

LAUNCH_COMMAND = "python -m paddle.distributed.launch --nproc_per_node N --log_dir /tmp/paddle-logs train.py"
LAUNCH_HINT = (f"Start every process with paddle's launcher ({LAUNCH_COMMAND}), which sets PADDLE_TRAINER_ID, "
               "PADDLE_TRAINERS_NUM, PADDLE_TRAINER_ENDPOINTS and PADDLE_CURRENT_ENDPOINT")
def slurm_variables(step: SlurmStep) -> dict[str, str]:
    """paddle's launcher variables for a task of ``srun -n N``: the store on the first node at the step's port,
    each task's endpoint on its node at the ports after it."""
    port = step.master_port
    endpoints = [f"{step.host_of(rank)}:{port + 1 + rank}" for rank in range(step.world_size)]
    return {
        "PADDLE_TRAINER_ID": str(step.rank), "PADDLE_TRAINERS_NUM": str(step.world_size),
        "PADDLE_TRAINER_ENDPOINTS": ",".join(endpoints), "PADDLE_CURRENT_ENDPOINT": endpoints[step.rank],
        "PADDLE_MASTER": f"{step.master_addr}:{port}", "PADDLE_LOCAL_RANK": str(step.local_rank),
        "PADDLE_RANK_IN_NODE": str(step.local_rank), "PADDLE_LOCAL_SIZE": str(step.local_world_size),
        "PADDLE_GLOBAL_RANK": str(step.rank), "PADDLE_GLOBAL_SIZE": str(step.world_size),
        "PADDLE_NNODES": str(len(step.hosts)),
    }


PADDLE_LAUNCH = LauncherVars(
    rank="PADDLE_TRAINER_ID", world_size="PADDLE_TRAINERS_NUM", local_rank=("PADDLE_LOCAL_RANK", "PADDLE_RANK_IN_NODE"),
    local_world_size="PADDLE_LOCAL_SIZE", hint=LAUNCH_HINT,
    start="python -m paddle.distributed.launch --nproc_per_node {n} train.py",
    needed_when_many=("PADDLE_TRAINER_ENDPOINTS", "PADDLE_CURRENT_ENDPOINT"), rank_word="the id",
    local_rank_word="the local rank", gpu="gpu", from_slurm=slurm_variables,
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
    overlap: bool  # average the gradients in DataParallel's reducer during backward, else once per step after it
    sharding: str | None = None
    """paddle's group sharding level (``'os'``, ``'os_g'``, ``'p_g_os'``), or None for data parallelism."""
    spawn_store: str | None = None
    """The folder of the store the parent of spawned processes made (``spawned`` only)."""
    gpus: tuple[int, ...] | None = None
    """The GPU of each rank, for the processes this one starts (``spawn`` on GPUs only)."""


@dataclasses.dataclass(frozen=True)
class _Env:
    """paddle's launcher variables of this process, with the stores they name."""

    layout: LauncherEnv
    master: tuple[str, int] | None
    backend: str | None
    spawn_store: str | None


def plan_distributed(model: Any, device: Any, nproc: Any, options: Mapping[str, Any]) -> DistPlan | None:
    """The distributed layout asked for, or None for one process (the single-device driver)."""
    check_layout_arguments(nproc, device)
    inner = model._layers if isinstance(model, paddle.DataParallel) else model
    if paddle.distributed.is_initialized():
        return _existing_plan(inner, device, nproc, options)
    if inner is not model:
        raise DriverError(
            "model is a paddle.DataParallel but the parallel environment is not initialised in this process; "
            "pass the bare model (drivetrain wraps it), or call paddle.distributed.init_parallel_env() before "
            "wrapping it."
        )
    env = read_env()
    launched = None if env is None else env.layout
    launch = DEVICES.launch(nproc, device, launched, model, spawned=env is not None and env.spawn_store is not None)
    if launch is None:
        return None
    if launch[0] == "spawn":
        return _make_plan(*launch, model, options)
    return _make_plan(*launch, model, options, env.master, backend=env.backend, spawn_store=env.spawn_store)


# ----------------------------------------------------------------------------- layouts
def _existing_plan(inner: Any, device: Any, nproc: Any, options: Mapping[str, Any]) -> DistPlan:
    from paddle import distributed as dist

    world, rank = dist.get_world_size(), dist.get_rank()
    check_process_count(nproc, world, "the world size of the parallel environment you initialised",
                        start=PADDLE_LAUNCH.start)
    refuse_late_options(options, ("timeout", "backend", "fleet", "strategy"), argument=_OPTIONS,
                        initialised="paddle.distributed.init_parallel_env (or fleet.init)")
    env = read_env()
    layout = env.layout if env is not None else LauncherEnv(rank, world, rank, world)
    if device is None:
        device = DEVICES.default(inner)
    from paddle.distributed.collective import _get_global_group

    group = type(getattr(_get_global_group(), "process_group", None)).__name__.lower()  # ProcessGroupNCCL, ...
    return _make_plan("existing", device, LauncherEnv(rank, world, layout.local_rank, layout.local_world_size), inner,
                      options, env.master if env is not None else None, backend="nccl" if "nccl" in group else "gloo")


def _make_plan(launch: str, device: Any, env: LauncherEnv, model: Any, options: Mapping[str, Any],
               master: tuple[str, int] | None = None, *, backend: str | None = None,
               spawn_store: str | None = None) -> DistPlan:
    resolved = DEVICES.for_rank(device, model, env.local_rank, env.local_world_size)
    backend = process_group_backend(options, argument=_OPTIONS, on_gpu=resolved.kind == "gpu", device=device,
                                    where=resolved, default=None if backend == "auto" else backend, gloo_on_gpu=False)
    fleet = bool_option(options, "fleet", False, argument=_OPTIONS)
    strategy = options.get("strategy")
    if strategy is not None:
        _check_strategy(strategy, fleet)
    gpus = None
    if launch == "spawn" and resolved.kind == "gpu":
        listed = isinstance(device, (list, tuple))
        gpus = tuple(d.index for d in DEVICES.listed(device)) if listed else tuple(range(env.world_size))
    return DistPlan(
        launch=launch, world_size=env.world_size, rank=env.rank, local_rank=env.local_rank, device=resolved,
        backend=backend, **plan_options(options, default_timeout=DEFAULT_TIMEOUT, argument=_OPTIONS), fleet=fleet,
        strategy=strategy, master=master, spawn_store=spawn_store, gpus=gpus,
        find_unused_parameters=bool_option(options, "find_unused_parameters", False, argument=_OPTIONS),
        overlap=bool_option(options, "overlap", backend == "nccl", argument=_OPTIONS),
        sharding=_sharding_option(options, resolved, fleet),
    )


def _sharding_option(options: Mapping[str, Any], device: Device, fleet: bool) -> str | None:
    """``paddle_kwargs['sharding']``: a level paddle knows, on a device paddle shards on, without fleet."""
    level = choice_option(options, "sharding", SHARDING_LEVELS, None, argument=_OPTIONS)
    if level is None:
        return None
    if fleet:
        raise DriverError(f"{_OPTIONS}['sharding']={level!r} wraps the model with group_sharded_parallel, but "
                          "'fleet': True wraps it with fleet.distributed_model; use one of them (remove 'fleet' for "
                          "group sharding).")
    if device.kind != "gpu":
        raise DriverError(
            f"{_OPTIONS}['sharding']={level!r} needs GPUs: paddle refuses to shard on {device.name} "
            f"(\"{_paddle_sharding_reason()}\"). On the CPU remove 'sharding' (plain data parallelism: every process "
            "holds the whole model), or train a torch model with driver='torch_fsdp' or driver='deepspeed', "
            "which shard on the CPU."
        )
    return level


def _paddle_sharding_reason() -> str:
    """paddle's own words for refusing the CPU: its device check runs before it looks at any argument."""
    if paddle.get_device().split(":")[0] == "cpu":
        from paddle.distributed.sharding import group_sharded_parallel

        try:
            group_sharded_parallel(None, None, "os")
        except AssertionError as exc:
            return str(exc) or _PADDLE_SHARDING_REASON
        except Exception:  # noqa: BLE001 - a paddle that checks something else first: its words are not these
            pass
    return _PADDLE_SHARDING_REASON


def _check_strategy(strategy: Any, fleet: bool) -> None:
    from paddle.distributed import fleet as paddle_fleet

    if not isinstance(strategy, paddle_fleet.DistributedStrategy):
        raise DriverError(f"paddle_kwargs['strategy']={strategy!r:.80} is not a "
                          "paddle.distributed.fleet.DistributedStrategy.")
    if not fleet:
        raise DriverError("paddle_kwargs['strategy'] configures fleet; add 'fleet': True (or remove the strategy).")
    configs = strategy.hybrid_configs
    other = {name: configs.get(name, 1) for name in ("mp_degree", "pp_degree", "sharding_degree", "sep_degree")}
    other = {name: value for name, value in other.items() if value not in (1, -1)}
    if other:
        raise DriverError(f"paddle_kwargs['strategy'] asks for {other}; drivetrain's paddle driver does data "
                          "parallelism only (every process holds the whole model). Leave the model, pipeline, "
                          "sharding and sep degrees at 1.")


# ---------------------------------------------------------------------- environment
def read_env() -> _Env | None:
    """paddle's launcher variables of this process, or None when neither PADDLE_TRAINER_ID nor
    PADDLE_TRAINERS_NUM is set."""
    launched = read_launcher_env(PADDLE_LAUNCH)
    if launched is None:
        return None
    world = launched.world_size
    master = None
    if world > 1:
        endpoints = os.environ["PADDLE_TRAINER_ENDPOINTS"].split(",")
        if len(endpoints) != world:
            raise DriverError(f"PADDLE_TRAINER_ENDPOINTS lists {len(endpoints)} endpoint(s) but "
                              f"PADDLE_TRAINERS_NUM={world}; list one host:port per process. {LAUNCH_HINT}.")
        master = master_address()
    return _Env(launched, master, os.environ.get("PADDLE_DISTRI_BACKEND"), _spawn_store())


def _spawn_store() -> str | None:
    """The store folder of a process the Trainer started, or None for any other process."""
    folder = os.environ.get(SPAWN_STORE_ENV)
    if folder is not None and not os.path.isdir(folder):
        raise DriverError(
            f"{SPAWN_STORE_ENV}={folder!r} is not a folder. The Trainer sets it for the processes it starts, and "
            f"the one that started this process has ended; unset {SPAWN_STORE_ENV}, or start every process with "
            "nproc= or device=[...] from a plain python train.py."
        )
    return folder


def master_address() -> tuple[str, int]:
    """Where paddle's process-group store listens: the same order of variables init_parallel_env reads."""
    master = env_master(hint=LAUNCH_HINT)
    if master is None and os.environ.get("PADDLE_MASTER"):
        return env_address("PADDLE_MASTER", hint=LAUNCH_HINT)
    first = os.environ.get("PADDLE_TRAINER_ENDPOINTS", "").split(",")[0]
    return master or env_address("PADDLE_TRAINER_ENDPOINTS", hint=LAUNCH_HINT, value=first)


# ---------------------------------------------------------------------------- devices
def _gpu_for_rank(device: Any, model: Any, local_rank: int, local_world: int) -> Device:
    """The GPU paddle's launcher selected for this process, else the one numbered ``local_rank``."""
    selected = os.environ.get("FLAGS_selected_gpus", "")  # paddle's launcher gives each process its GPU
    return resolve_device(int(selected) if selected.isdigit() else local_rank, model)


def _parse_listed(item: Any, given: str) -> Device:
    """One entry of a device list: paddle's own rules, the error prefixed by the whole list."""
    if item is None or isinstance(item, (list, tuple)):
        raise DriverError(f"{given}: {item!r} is not a device; list GPU indices ([0, 1]) or 'gpu:N' strings.")
    try:
        return resolve_device(item, None)
    except DriverError as exc:
        raise DriverError(f"{given}: {exc}") from None


DEVICES = DeviceRules(names=PADDLE_LAUNCH, model_device=model_device, resolve=resolve_device,
                      on_gpu=lambda d: d.kind == "gpu", gpu_for_rank=_gpu_for_rank,
                      gpu_count=lambda: paddle.device.cuda.device_count(), parse_listed=_parse_listed)
