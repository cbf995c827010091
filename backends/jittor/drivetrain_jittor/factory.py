"""The factory the plugin points at: builds the single-process jittor driver, or the MPI one under ``mpirun``.

It lives apart from both drivers so that neither imports the other: :mod:`.distributed`
builds on :mod:`.driver`, and only this module knows both. :mod:`.distributed` is
imported only under ``mpirun``.
"""

from __future__ import annotations

from typing import Any

from drivetrain.backend import Driver, DriverError, module_driver_factory

from .driver import JittorSingleDriver, jt


def _distributed(model: Any, device: Any, nproc: int | None, options: dict[str, Any]) -> Driver | None:
    """The MPI driver under ``mpirun`` (``device`` may list one device per process on this machine); outside
    MPI several processes are refused with the mpirun command: jittor's data parallelism is MPI."""
    if jt.in_mpi:
        from .distributed import JittorMPIDriver, mpi_layout

        return JittorMPIDriver(model, mpi_layout(device, nproc, jt), **options)
    if nproc is not None and nproc > 1 or isinstance(device, (list, tuple)) and len(device) > 1:
        count = nproc if nproc is not None and nproc > 1 else len(device)
        what = f"nproc={nproc}" if nproc is not None and nproc > 1 else f"device={list(device)!r}"
        raise DriverError(
            f"{what} asks for {count} processes, but jittor trains data-parallel only under MPI and cannot start "
            f"processes itself: run `mpirun -np {count} python your_script.py` (as root add --allow-run-as-root) "
            "and pass device='cpu' or 'cuda' (each process takes the GPU of its local rank)."
        )
    return None


create_driver = module_driver_factory(JittorSingleDriver, _distributed)
"""Build the jittor driver for ``model`` on ``device``: the MPI one (:class:`~drivetrain_jittor.distributed.
JittorMPIDriver`) under ``mpirun`` (OpenMPI's ``OMPI_COMM_WORLD_SIZE`` in the environment), else
:class:`~drivetrain_jittor.driver.JittorSingleDriver` on the first listed device."""
