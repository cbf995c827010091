"""The supervisor behind ``Trainer(..., nproc=N)`` in a plain ``python train.py``, and the re-run of a task of
``srun -n N python train.py`` (:func:`rerun`).

oneflow connects to its peers when it is imported, so a process that has already
imported oneflow alone cannot become rank 0 of a group. Instead, the process that
builds the Trainer starts N workers running the same command line (same interpreter,
same options, ``sys.orig_argv``) with the variables ``oneflow.distributed.launch``
would set, watches them, and exits with their verdict: code after ``Trainer(...)``
runs in the workers only. Hence the rules the docs spell out: the script must be safe
to run again (``if __name__ == "__main__":``), and a notebook or ``python -c`` cannot
be re-run.

Life and death are the core's :meth:`drivetrain.backend.Launcher.supervise`:

- workers die with the supervisor (Linux ``PR_SET_PDEATHSIG``), so a killed supervisor
  leaves no orphans;
- when a worker exits with a non-zero code (an exception, ``kill -9``, an abort), the
  supervisor names it on stderr, gives the others ``timeout`` seconds to stop by
  themselves (oneflow aborts a process whose peer is lost), then kills them, and exits 1.
"""

from __future__ import annotations

import os
from typing import NoReturn

from drivetrain.backend import (
    DistPlan,
    Launcher,
    SlurmStep,
    free_ports,
    local_launch_env,
    relaunch_command,
    rerun_slurm_task,
    torchrun_variables,
)

START_YOURSELF = "python -m oneflow.distributed.launch --nproc_per_node N train.py"


def supervise(plan: DistPlan) -> NoReturn:
    """Run the script as ``plan.world_size`` workers and exit this process with their verdict."""
    launcher = Launcher(plan.world_size, plan.timeout, plan.spawn_output, relaunch_command(START_YOURSELF),
                        timeout_option="oneflow_kwargs['timeout']")
    port = free_ports(1)[0]  # the workers' rendezvous; oneflow's master binds it

    def worker_env(rank: int) -> dict[str, str]:
        """What ``oneflow.distributed.launch`` sets for ``rank``."""
        return {**local_launch_env(rank, plan.world_size, port),
                "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}

    launcher.supervise(worker_env)


def rerun(step: SlurmStep) -> NoReturn:
    """Run this task of a Slurm step again in its place, with the variables ``oneflow.distributed.launch`` would
    set, taken from Slurm's: oneflow joins its peers when it is imported, and this task imported it alone."""
    # oneflow's lone import replaced the launcher variables with its one-process defaults (MASTER_PORT a free
    # port of its own); a MASTER_PORT the task was started with is still in its initial environment
    os.environ.pop("MASTER_PORT", None)
    given = _initial_environment().get("MASTER_PORT")
    if given:
        os.environ["MASTER_PORT"] = given
    rerun_slurm_task(step, torchrun_variables(step), framework="oneflow",
                     reason="with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set: oneflow joins its peers when it "
                     "is imported, and the script imported it before the Trainer",
                     start_yourself="srun -n {n} python train.py")


def _initial_environment() -> dict[str, str]:
    """The variables this process was started with (Linux's /proc/self/environ; empty elsewhere)."""
    try:
        with open("/proc/self/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return {}
    pairs = (item.decode(errors="replace").partition("=") for item in raw.split(b"\0") if b"=" in item)
    return {name: value for name, _, value in pairs}
