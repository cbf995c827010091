"""The supervisor behind ``Trainer(..., nproc=N)`` in a plain ``python train.py``.

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

from drivetrain.backend import Launcher, free_ports, local_launch_env, relaunch_command

from ._dist_plan import DistPlan

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
