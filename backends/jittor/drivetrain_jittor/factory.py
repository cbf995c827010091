"""The factory the plugin points at: builds the single-process jittor driver, or the MPI one under ``mpirun``.

It lives apart from both drivers so that neither imports the other: :mod:`.distributed`
builds on :mod:`.driver`, and only this module knows both. :mod:`.distributed` is
imported only under ``mpirun``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from drivetrain.backend import DriverError

from .driver import JittorSingleDriver, check_model, jt


def create_driver(
    model: Any,
    device: Any,
    *,
    nproc: int | None = None,
    precision: str = "fp32",
    grad_clip: float | None = None,
    grad_clip_type: str = "norm",
    model_wo_auto_param_call: bool = False,
    framework_kwargs: Mapping[str, Any] | None = None,
) -> JittorSingleDriver:
    """Build the jittor driver for ``model`` on ``device``.

    Under ``mpirun`` (OpenMPI's ``OMPI_COMM_WORLD_SIZE`` in the environment) the MPI driver
    (:class:`~drivetrain_jittor.distributed.JittorMPIDriver`) is built; ``device`` may then
    list one device per process on this machine. Outside MPI a list of several devices or
    ``nproc > 1`` is refused with the mpirun command to use: jittor's data parallelism is MPI.
    """
    check_model(model)
    options = dict(precision=precision, grad_clip=grad_clip, grad_clip_type=grad_clip_type,
                   model_wo_auto_param_call=model_wo_auto_param_call, framework_kwargs=framework_kwargs)
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
    if isinstance(device, (list, tuple)):
        if not device:
            raise DriverError("device=[] lists no device; pass 'cpu' or 'cuda'.")
        device = device[0]
    return JittorSingleDriver(model, device, **options)
