"""The device and process-group rules every backend's layout planning shares.

A backend's ``_dist_plan`` module turns ``device=``, ``nproc=`` and the launcher's
environment into one process's place in the run. What a device *is* stays with the
backend (it parses its own device strings into a kind and an index); the rules about a
list of them (one process per entry, never CPU and GPUs mixed, each GPU once), counting
GPUs for the processes the Trainer starts, the process-group backend and the option
dicts handed to the framework's data-parallel wrapper are the same everywhere and live here.
A backend fills a :class:`DeviceRules` with its framework's device calls; its methods decide
each process's launch and device the same way for every backend. They only check and
compute (no process group is created), so a wrong combination fails in the first process.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .._common import DriverError
from .options import (
    LauncherEnv,
    LauncherVars,
    check_launched_layout,
    check_process_count,
    choice_option,
    one_gpu_for_many,
    processes_wanted,
)
from .spawn import SPAWN_PARENT_ENV

LAUNCH_OPTION_DOCS = {
    "even_batches": "bool (default False): True refuses a training set whose last global batch would be "
    "padded with repeated samples (use drop_last=True or a divisible size)",
    "spawn_output": "'inherit' (default) or 'prefix': output of the processes the Trainer starts; 'prefix' "
    "starts each of their lines with [rank N]",
}
"""Descriptions of the launch options :func:`~drivetrain.backend.plan_options` reads, for a backend's accepted kwargs."""


@dataclasses.dataclass(frozen=True)
class DeviceSlot:
    """One entry of a device list as the backend parsed it: ``kind`` is ``"cpu"`` or ``"gpu"``."""

    kind: str
    index: int | None
    name: str
    """How the backend writes the device in messages (``cuda:0``, ``gpu:1``)."""


def check_distinct_devices(devices: Sequence[Any], slots: Sequence[DeviceSlot]) -> None:
    """A device list starts one process per entry: all GPUs, each named once by its index.

    ``slots`` are the entries of ``devices`` as the backend parsed them. Several CPU
    entries are refused with the spelling that does ask for N CPU processes.
    """
    given = f"device={list(devices)!r}"
    kinds = {slot.kind for slot in slots}
    if len(kinds) > 1:
        raise DriverError(f"{given} mixes CPU and GPUs; list only GPUs, or use device='cpu' with nproc=N.")
    if "cpu" in kinds and len(slots) > 1:
        n = len(slots)
        raise DriverError(
            f"{given} lists the CPU {n} times; to train with {n} CPU processes pass "
            f"device='cpu', nproc={n}."
        )
    seen: set[int | None] = set()
    for slot in slots:
        if slot.kind == "gpu" and slot.index is None:
            raise DriverError(f"{given}: {slot.name!r} has no GPU index; list explicit GPUs such as [0, 1].")
        if slot.index in seen:
            raise DriverError(
                f"{given} lists {slot.name} more than once; one process runs per listed device: list each GPU "
                "once, e.g. [0, 1]."
            )
        seen.add(slot.index)


def check_enough_gpus(device: Any, nproc: int, count: int) -> None:
    """``nproc`` processes the Trainer starts on ``device``'s GPUs need one GPU each."""
    if nproc > count:
        raise DriverError(
            f"nproc={nproc} with device={device!r} needs {nproc} GPUs (one per process) but this machine has "
            f"{count} visible GPU(s); pass nproc={count} or less, or device='cpu' to train with CPU processes."
        )


def spawn_request(nproc: Any, device: Any, env: LauncherEnv | None, names: LauncherVars) -> tuple[int, Any] | None:
    """How many processes the Trainer must start and on which device(s), or None for one process.

    Called once neither an initialised process group nor a multi-process launcher
    applies; a launcher that started this process alone cannot grow to more.
    """
    wanted = processes_wanted(nproc, device)
    if env is not None and wanted > 1:
        check_process_count(wanted, env.world_size, names.world_size, start=names.start)
    if wanted == 1:
        return None
    if isinstance(device, (list, tuple)) and len(device) == 1:
        device = device[0]
    return wanted, device


@dataclasses.dataclass(frozen=True, kw_only=True)
class DeviceRules:
    """A backend's device calls, and the rules every backend applies with them to ``device=`` in a run.

    The devices the calls return are the framework's own; they have an ``index`` (None
    on the CPU) and print as the name messages use (``cuda:0``, ``gpu:1``).
    """

    names: LauncherVars
    """The launcher: its ``gpu`` word is what ``device=None`` means for a model on a GPU."""
    model_device: Callable[[Any], Any]
    """``model -> device``: where the model is."""
    resolve: Callable[[Any, Any], Any]
    """``(device, model) -> device``: one process's checked device; it says why a GPU cannot be used."""
    on_gpu: Callable[[Any], bool]
    """Whether a device the other calls returned is a GPU."""
    gpu_count: Callable[[], int]
    """How many GPUs this process can use (0 where it cannot use any: ``resolve`` then says why)."""
    gpu_for_rank: Callable[[Any, Any, int, int], Any]
    """``(device, model, local_rank, local_world) -> device``: the GPU of a local rank for an "any GPU" device."""
    parse_listed: Callable[[Any, str], Any]
    """``(item, given) -> device``: one entry of a device list; ``given`` (``device=[...]``) starts its errors."""
    check_listed: Callable[[list[Any], str], None] | None = None
    """``(devices, given)``: a parsed list of GPUs as a whole (that they exist), after the distinct-device rules."""

    def unnamed_gpu(self, device: Any) -> bool:
        """Whether ``device=`` asks for GPUs without naming one (``'gpu'``, ``'cuda'``, a framework device of type
        cuda whose index is None) where this process can use GPUs: then each process takes its own."""
        if isinstance(device, str):
            unnamed = device.strip().lower() in ("cuda", "gpu")
        else:
            unnamed = getattr(device, "type", None) == "cuda" and getattr(device, "index", 0) is None
        return unnamed and self.gpu_count() > 0

    def default(self, model: Any) -> str:
        """What ``device=None`` means in a run: any GPU for a model on a GPU, else the CPU."""
        return self.names.gpu if self.on_gpu(self.model_device(model)) else "cpu"

    def listed(self, devices: Sequence[Any]) -> list[Any]:
        """A device list, parsed and checked: one distinct device per process, all CPU or all GPUs."""
        given = f"device={list(devices)!r}"
        parsed = [self.parse_listed(item, given) for item in devices]
        check_distinct_devices(devices, [DeviceSlot("gpu" if self.on_gpu(d) else "cpu", d.index, str(d))
                                         for d in parsed])
        if self.check_listed is not None and self.on_gpu(parsed[0]):
            self.check_listed(parsed, given)
        return parsed

    def for_rank(self, device: Any, model: Any, local_rank: int, local_world: int) -> Any:
        """This process's device: the ``local_rank``-th listed one, or the GPU of ``local_rank``, or the one named
        (one GPU for several processes of this machine is refused)."""
        if isinstance(device, (list, tuple)):
            return self.listed(device)[local_rank]
        if device is None:
            device = self.default(model)
        if self.unnamed_gpu(device):
            return self.gpu_for_rank(device, model, local_rank, local_world)
        resolved = self.resolve(device, model)
        if self.on_gpu(resolved) and local_world > 1:
            raise one_gpu_for_many(device, local_world, self.names, spawn=False)
        return resolved

    def check_spawn(self, device: Any, nproc: int, model: Any) -> None:
        """``device`` (not a list) for ``nproc`` processes the Trainer starts: one CPU each, or GPUs 0..nproc-1."""
        if device is None:
            device = self.default(model)
        if self.unnamed_gpu(device):
            check_enough_gpus(device, nproc, self.gpu_count())
        elif self.on_gpu(self.resolve(device, model)):  # resolving also says why a GPU cannot be used
            raise one_gpu_for_many(device, nproc, self.names, spawn=True)

    def launch(self, nproc: Any, device: Any, env: LauncherEnv | None, model: Any, *,
               spawned: bool | None = None) -> tuple[str, Any, LauncherEnv] | None:
        """``(launch, device, layout)`` of a process outside any process group the user started, or None for one
        process: a launcher (``"env"``) or the Trainer (``"spawned"``) started it as one of several, else it is
        rank 0 of the processes the Trainer starts (``"spawn"``); ``nproc=`` and ``device=`` are checked against it.
        ``spawned``: whether the Trainer started this process (None: read from the environment it set).
        """
        if spawned is None:
            spawned = SPAWN_PARENT_ENV in os.environ
        if env is not None and (env.world_size > 1 or spawned):
            check_launched_layout(nproc, device, env, self.names)
            return "spawned" if spawned else "env", device, env
        request = spawn_request(nproc, device, env, self.names)
        if request is None:
            return None
        wanted, device = request
        if isinstance(device, (list, tuple)):
            self.listed(device)
        else:
            self.check_spawn(device, wanted, model)
        return "spawn", device, LauncherEnv(0, wanted, 0, wanted)


def refuse_late_options(options: Mapping[str, Any], keys: Sequence[str], *, argument: str, initialised: str) -> None:
    """Options that configure starting the process group mean nothing once the user started it."""
    for key in keys:
        if key in options:
            raise DriverError(
                f"{argument}[{key!r}] applies when drivetrain creates the process group, but {initialised} was "
                "already called; pass it there instead, or remove it."
            )


def process_group_backend(options: Mapping[str, Any], *, argument: str, on_gpu: bool, device: Any, where: Any,
                          default: str | None = None, gloo_on_gpu: bool = True) -> str:
    """``options['backend']``: ``'gloo'`` or ``'nccl'`` (default: nccl on GPUs, gloo on the CPU), checked
    against this process's device ``where``; ``gloo_on_gpu=False`` for frameworks whose gloo is CPU-only."""
    backend = choice_option(options, "backend", ("gloo", "nccl"), default, argument=argument)
    if backend is None:
        backend = "nccl" if on_gpu else "gloo"
    if backend == "nccl" and not on_gpu:
        raise DriverError(
            f"the backend is 'nccl', which needs GPUs, but device={device!r} puts this process on "
            f"{where}; use the 'gloo' backend on CPU (the default there) or pass GPU devices."
        )
    if backend == "gloo" and on_gpu and not gloo_on_gpu:
        raise DriverError(
            f"the backend is 'gloo' but device={device!r} puts this process on {where}; this "
            "framework's gloo runs on the CPU only: use 'nccl' with GPUs (the default there)."
        )
    return backend


def wrapper_options(options: Mapping[str, Any], key: str, *, argument: str, wrapper: str, accepted: Sequence[str],
                    reserved: Sequence[str] = (), note: str = "") -> dict[str, Any]:
    """``options[key]``: a dict of keyword arguments for the framework's ``wrapper`` (e.g. its
    DistributedDataParallel), each one accepted by it and none that drivetrain sets itself."""
    value = options.get(key) or {}
    where = f"{argument}[{key!r}]"
    if not isinstance(value, Mapping):
        raise DriverError(f"{where}={value!r} must be a dict of {wrapper} options.")
    for name in value:
        if name in reserved:
            raise DriverError(f"{where}[{name!r}] is set by drivetrain from device= and the process group; remove it.")
        if name not in accepted:
            raise DriverError(f"{where}[{name!r}] is not a {wrapper} option; accepted: {list(accepted)}.{note}")
    return dict(value)
