"""The supervisor behind ``Trainer(..., nproc=N)`` in a plain ``python train.py`` and behind
``python -m drivetrain_jax.run --nproc_per_node N train.py``; and the re-run of a task of ``srun -n N python
train.py`` (:func:`rerun`).

A process that has used JAX alone (it built the model) cannot join a distributed run any more. So it starts N
workers running the same command under ``python -m drivetrain_jax.run`` (which joins the run first) with torchrun's
variables, watches them and exits with their verdict: code after ``Trainer(...)`` runs in the workers only, the
script must be safe to run again (``if __name__ == "__main__":``), and a notebook or ``python -c`` cannot be re-run.
Life and death are the core's :meth:`drivetrain.backend.Launcher.supervise`: workers die with the supervisor, and
when one fails the others get ``timeout`` seconds to stop, then are killed.
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import NoReturn

from drivetrain.backend import (
    Launcher,
    SlurmStep,
    free_ports,
    local_launch_env,
    relaunch_command,
    rerun_slurm_task,
)

LAUNCH = "python -m drivetrain_jax.run --nproc_per_node {n} train.py"


def worker_command(start_yourself: str = LAUNCH.format(n="N")) -> list[str]:
    """This program's command line run under ``python -m drivetrain_jax.run`` (interpreter options kept); a
    notebook, ``python -c`` or pytest is refused, naming ``start_yourself``."""
    command = relaunch_command(start_yourself)
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    program = ["-m", spec.name, *sys.argv[1:]] if spec is not None else sys.argv[:]
    return [command[0], *command[1:len(command) - len(program)], "-m", "drivetrain_jax.run", *program]


def supervise(world_size: int, command: list[str], timeout: float = 60.0, output: str = "inherit") -> NoReturn:
    """Run ``command`` as ``world_size`` workers on this machine and exit this process with their verdict."""
    launcher = Launcher(world_size, timeout, output, command, timeout_option="jax_kwargs['timeout']")
    port = free_ports(1)[0]  # rank 0's jax.distributed coordinator binds it

    def worker_env(rank: int) -> dict[str, str]:
        return {**local_launch_env(rank, world_size, port), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}

    # the workers are started with fork + exec (so that they die with this process): JAX's warning that forking
    # a multithreaded process may deadlock concerns a child that goes on running Python, not one that execs
    warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning)
    launcher.supervise(worker_env)


def rerun(step: SlurmStep) -> NoReturn:
    """Run this task of a Slurm step again in its place, under ``python -m drivetrain_jax.run``, which joins the
    step's tasks before the script runs: the task has used JAX alone (it built the model), too late for
    ``jax.distributed.initialize``."""
    rerun_slurm_task(step, {}, framework="jax", command=worker_command,
                     reason="JAX was used before the Trainer, and jax.distributed.initialize must come first: "
                     "python -m drivetrain_jax.run joins the tasks before the script runs",
                     start_yourself="srun -n {n} python -m drivetrain_jax.run train.py")
