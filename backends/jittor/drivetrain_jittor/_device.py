"""Devices for the jittor backend: parsing ``device=`` and checking that CUDA can be used.

jittor has no per-tensor or per-module device: one process-wide flag,
``jt.flags.use_cuda``, decides where every operation runs, and a process uses one
GPU (jittor binds it from ``CUDA_VISIBLE_DEVICES``, or from the MPI local rank).
So a device here is just ``"cpu"`` or ``"cuda"``; a GPU index other than 0 is refused
with the way to choose that GPU (setting ``jt.flags.device_id`` would make jittor
restart the whole process, which a driver must not do behind the user's back).
"""

from __future__ import annotations

from typing import Any

from drivetrain.backend import OTHER_DEVICE_KINDS, DriverError, parse_device_arg

ACCEPTED = "'cpu', 'cuda' (aliases 'gpu', 'cuda:0', 0), or None for jittor's current setting"
_OTHER_KINDS = (*OTHER_DEVICE_KINDS, "rocm", "hip")


def resolve_device(device: Any, jt: Any, argument: str = "device") -> str:
    """``"cpu"`` or ``"cuda"`` for the user's ``device=``, refusing what jittor cannot do with the reason."""
    given = f"{argument}={device!r}"
    if device is None:
        return "cuda" if jt.flags.use_cuda else "cpu"
    parsed = None if isinstance(device, bool) else parse_device_arg(device, ACCEPTED, given)
    if parsed is None:
        if isinstance(device, str) and device.strip().lower().split(":")[0] in _OTHER_KINDS:
            raise DriverError(f"{given} is a device kind the jittor driver does not support; accepted: {ACCEPTED}.")
        kind = f" (a {type(device).__name__})" if not isinstance(device, str) else ""
        raise DriverError(f"{given}{kind} is not a device the jittor driver understands; accepted: {ACCEPTED}.")
    kind, index = parsed
    if kind == "cpu":
        return "cpu"
    check_cuda(given, jt)
    if index:
        raise DriverError(
            f"{given}: jittor uses one GPU per process, GPU 0 of those it sees, and chooses it through the "
            f"environment; start the process with CUDA_VISIBLE_DEVICES={index} and pass device='cuda'."
        )
    return "cuda"


def check_cuda(given: str, jt: Any) -> None:
    """Raise a DriverError saying why jittor cannot use CUDA in this process, if it cannot."""
    if jt.has_cuda:
        return
    import os

    if os.environ.get("nvcc_path", None) == "":
        why = ("nvcc_path is set to '' in the environment (drivetrain-jittor sets it when no NVIDIA driver "
               "answers, so that jittor does not try to build CUDA support it cannot run)")
    else:
        why = "jittor found no usable CUDA (no NVIDIA driver, or no nvcc it could compile with)"
    raise DriverError(
        f"{given} asks for a GPU, but jittor has no CUDA in this process: {why}. Use device='cpu', or run on a "
        "machine with an NVIDIA GPU and driver (jittor then finds nvcc, or downloads its own CUDA toolkit)."
    )


def apply_device(device: str, jt: Any) -> None:
    """Make ``device`` jittor's global one (``jt.flags.use_cuda``)."""
    want = 1 if device == "cuda" else 0
    if jt.flags.use_cuda != want:
        jt.flags.use_cuda = want
