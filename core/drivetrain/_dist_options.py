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
from collections.abc import Mapping
from typing import Any

from ._errors import DriverError

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
