"""The factory the plugin points at: builds the single-process jittor driver, or the MPI one under ``mpirun``.

It lives apart from both drivers so that neither imports the other: :mod:`.distributed`
builds on :mod:`.driver`, and only this module knows both. :mod:`.distributed` is
imported only under ``mpirun``.

A task of ``srun --mpi=pmix -n N`` has an MPI world (Slurm's PMIx server), but jittor joins MPI
at import only where OpenMPI's ``mpirun`` variables are set (``OMPI_COMM_WORLD_SIZE``), and the
script imported it before the Trainer: the task runs its program again in its place with those
variables taken from Slurm's (:func:`join_slurm_step`).
"""

from __future__ import annotations

import os
from typing import Any, NoReturn

from drivetrain.backend import (
    Driver,
    DriverError,
    SlurmStep,
    module_driver_factory,
    rerun_slurm_task,
    slurm_step,
)

from .driver import JittorSingleDriver, jt


def _distributed(model: Any, device: Any, nproc: int | None, options: dict[str, Any]) -> Driver | None:
    """The MPI driver under ``mpirun`` (``device`` may list one device per process on this machine); outside
    MPI several processes are refused with the mpirun command: jittor's data parallelism is MPI."""
    if jt.in_mpi:
        from .distributed import JittorMPIDriver, mpi_layout

        return JittorMPIDriver(model, mpi_layout(device, nproc, jt), **options)
    step = slurm_step()
    if step is not None:
        join_slurm_step(step)
    if nproc is not None and nproc > 1 or isinstance(device, (list, tuple)) and len(device) > 1:
        count = nproc if nproc is not None and nproc > 1 else len(device)
        what = f"nproc={nproc}" if nproc is not None and nproc > 1 else f"device={list(device)!r}"
        raise DriverError(
            f"{what} asks for {count} processes, but jittor trains data-parallel only under MPI and cannot start "
            f"processes itself: run `mpirun -np {count} python your_script.py` (as root add --allow-run-as-root) "
            "and pass device='cpu' or 'cuda' (each process takes the GPU of its local rank)."
        )
    return None


def join_slurm_step(step: SlurmStep) -> NoReturn:
    """Run this task of ``srun --mpi=pmix -n N`` again with the variables jittor joins MPI by (OpenMPI's MPI_Init
    finds Slurm's PMIx server by itself); refused without PMIx, where MPI_Init would make N worlds of one."""
    n = step.world_size
    if "PMIX_RANK" not in os.environ:
        raise DriverError(
            f"this process is task {step.rank} of a Slurm step of {n} tasks started without PMIx, and jittor trains "
            f"data-parallel only under MPI: start the tasks with srun --mpi=pmix -n {n} python your_script.py (srun "
            f"--mpi=list names pmix where Slurm has it), or run mpirun -np {n} python your_script.py inside the "
            "allocation (as root add --allow-run-as-root).")
    if getattr(jt, "mpi", None) is None:
        raise DriverError(
            f"this process is task {step.rank} of srun --mpi=pmix -n {n}, but jittor was imported without its MPI "
            "extension (no mpicc on the PATH, or mpicc_path='' or use_mpi=0 set): install OpenMPI with its headers "
            "(apt-get install openmpi-bin libopenmpi-dev) and start the tasks again.")
    variables = {"OMPI_COMM_WORLD_SIZE": str(n), "OMPI_COMM_WORLD_RANK": str(step.rank),
                 "OMPI_COMM_WORLD_LOCAL_RANK": str(step.local_rank),
                 "OMPI_COMM_WORLD_LOCAL_SIZE": str(step.local_world_size),
                 "OMPI_COMM_WORLD_NODE_RANK": str(step.node_rank)}
    rerun_slurm_task(step, variables, framework="jittor",
                     reason="with OpenMPI's OMPI_COMM_WORLD_* variables set: jittor joins MPI when it is imported, "
                     "only where mpirun's variables are, and the script imported it before the Trainer",
                     start_yourself="srun --mpi=pmix -n {n} python train.py")


create_driver = module_driver_factory(JittorSingleDriver, _distributed)
"""Build the jittor driver for ``model`` on ``device``: the MPI one (:class:`~drivetrain_jittor.distributed.
JittorMPIDriver`) under ``mpirun`` (OpenMPI's ``OMPI_COMM_WORLD_SIZE`` in the environment), else
:class:`~drivetrain_jittor.driver.JittorSingleDriver` on the first listed device."""
