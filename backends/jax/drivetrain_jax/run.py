"""``python -m drivetrain_jax.run [--nproc_per_node N] train.py [args]``: the processes of a data-parallel JAX run.

``jax.distributed.initialize`` must come before anything initialises JAX (building a model does), so a Trainer,
built after the model, cannot join a run itself: each process is started under this module, which joins first and
then runs the script as ``python`` would (``-m package.module`` too), with ``sys.argv`` as the script expects.

- ``--nproc_per_node N``: start N such processes on this machine, watch them, exit with their verdict (what
  ``Trainer(nproc=N)`` does from a plain ``python train.py``);
- without it, one process whose place comes from torchrun-style variables (``RANK``, ``WORLD_SIZE``,
  ``MASTER_ADDR``, ``MASTER_PORT``; another launcher or a scheduler sets them), else from the task's Slurm
  variables in a step of several tasks (``srun -n N``: the coordinator on the step's first node at the port
  derived from the job id, as torch's and paddle's drivers do), else from JAX's own detection of a cluster (Open
  MPI, ...). Under ``torchrun --nproc_per_node N -m drivetrain_jax.run train.py`` torchrun's agent holds
  ``MASTER_PORT``, so JAX's coordinator takes the port after it.
"""

from __future__ import annotations

import os
import runpy
import sys

USAGE = "usage: python -m drivetrain_jax.run [--nproc_per_node N] (script.py | -m module) [args...]"
START = ("start every process with python -m drivetrain_jax.run train.py and RANK, WORLD_SIZE, MASTER_ADDR and "
         "MASTER_PORT set (python -m drivetrain_jax.run --nproc_per_node N train.py does it on one machine), or pass "
         "nproc=N to the Trainer in python train.py")


def join() -> None:
    """Join the run the environment describes (``jax.distributed.initialize``; gloo collectives on CPU)."""
    import jax

    from drivetrain.backend import DriverError, env_int, env_master, slurm_step, torchrun_variables

    if "WORLD_SIZE" not in os.environ:
        step = slurm_step()
        if step is None:
            jax.distributed.initialize()  # JAX's cluster detection (Open MPI, Kubernetes, ...)
            return
        os.environ.update(torchrun_variables(step))  # a task of srun -n N

    master = env_master(hint=START)
    if master is None:
        raise DriverError(f"WORLD_SIZE is set but MASTER_ADDR/MASTER_PORT are not: {START}.")
    port = master[1] + (1 if "TORCHELASTIC_RUN_ID" in os.environ else 0)  # torchrun's agent listens on MASTER_PORT
    jax.distributed.initialize(f"{master[0]}:{port}", num_processes=env_int("WORLD_SIZE", hint=START),
                               process_id=env_int("RANK", hint=START))


def main(argv: list[str]) -> None:
    if argv[:1] == ["--nproc_per_node"] and len(argv) > 2 and argv[1].isdigit():
        from ._launch import supervise

        supervise(int(argv[1]), [sys.executable, "-m", "drivetrain_jax.run", *argv[2:]])
    if not argv or argv[0].startswith("-") and argv[0] != "-m" or argv[0] == "-m" and len(argv) < 2:
        sys.exit(USAGE)
    join()
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(argv)
        sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
        runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
