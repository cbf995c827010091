"""Which process layout a jax Trainer asks for: decided once, in the factory, before anything starts.

``jax.distributed.initialize`` must run before JAX does anything, so it cannot come from the Trainer (built after
the model): every process of a run is started with ``python -m drivetrain_jax.run train.py`` (:mod:`.run`), which
joins first. The plan is then:

- ``env``: this process already belongs to a run of ``jax.process_count() > 1`` (started by ``drivetrain_jax.run``
  under any launcher, by the Trainer's supervisor, or after the user's own ``jax.distributed.initialize()``);
- ``spawn``: ``nproc=N`` in a plain ``python train.py``: this process, already using JAX alone, becomes a
  supervisor that runs the command again as N workers under ``drivetrain_jax.run`` (:mod:`._launch`) and exits
  with their verdict;
- (none: a task of a Slurm step of several tasks, ``srun -n N python train.py``, that has used JAX alone runs its
  command again in its place, ``exec``, under ``drivetrain_jax.run``, which joins the step's tasks first:
  :func:`._launch.rerun`);
- None: one process.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

import jax

from drivetrain.backend import (
    LAUNCH_OPTION_DOCS,
    DriverError,
    check_layout_arguments,
    check_process_count,
    env_int,
    plan_options,
    slurm_step,
)
from drivetrain.backend import DistPlan as CoreDistPlan

from .run import START

DEFAULT_TIMEOUT = 60.0
LAUNCH = "python -m drivetrain_jax.run --nproc_per_node {n} train.py"
ARGUMENT = "jax_kwargs"
DIST_KWARGS = {
    "timeout": "seconds (default 60): the longest one driver operation (a step, a collective) may wait for the "
    "other processes before this process ends, naming the rank (JAX's CPU collectives have no timeout of their "
    "own), and how long the supervisor lets the others stop by themselves after one failed",
    **LAUNCH_OPTION_DOCS,
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class DistPlan(CoreDistPlan):
    """One process's place in a JAX run: ``launch`` is ``"env"`` (joined) or ``"spawn"`` (the supervisor);
    ``device`` is this process's first local ``jax.Device``."""


def plan_distributed(model: Any, device: Any, nproc: Any, options: Mapping[str, Any]) -> DistPlan | None:
    """The distributed layout asked for, or None for one process."""
    if check_layout_arguments(nproc, device):
        raise DriverError(f"device={list(device)!r}: the jax driver takes no device list; pass nproc=N (each process "
                          "takes its first local device: the CPU, or the GPU its launcher gives it).")
    common = plan_options(options, default_timeout=DEFAULT_TIMEOUT, argument=ARGUMENT)
    world = jax.process_count()
    if world > 1:
        check_process_count(nproc, world, "jax.process_count()", start=LAUNCH)
        return DistPlan(launch="env", world_size=world, rank=jax.process_index(),
                        local_rank=env_int("LOCAL_RANK", jax.process_index(), hint=START),
                        device=jax.local_devices()[0], backend="gloo", **common)
    if int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
        raise DriverError(f"WORLD_SIZE={os.environ['WORLD_SIZE']} is set, but JAX runs as one process: "
                          "jax.distributed.initialize() must come before anything uses JAX, so start each process "
                          "with python -m drivetrain_jax.run train.py (python -m drivetrain_jax.run --nproc_per_node N "
                          "train.py starts N on this machine), or call jax.distributed.initialize() first thing.")
    step = slurm_step()
    if step is not None:  # nproc= in a step is refused once the task joined (check_slurm_world)
        from ._launch import rerun

        rerun(step)  # this task, again, under drivetrain_jax.run: it joins srun's others
    if nproc is not None and nproc > 1:
        return DistPlan(launch="spawn", world_size=nproc, rank=0, local_rank=0, device=None, backend="gloo",
                        **common)
    return None
