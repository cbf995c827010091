"""Devices for the oneflow backend: parse the user's ``device=`` once, and move batches there.

oneflow 0.9 aborts the whole process (SIGABRT, no Python exception) when a tensor
or module is moved to ``cuda`` on a machine without a usable GPU, so every CUDA
device is checked with ``oneflow.cuda.is_available()`` and ``device_count()``
here, before anything moves.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import oneflow as flow

from drivetrain.backend import (
    DriverError,
    first_tensor,
    parse_device_arg,
    unaccepted_device,
    usable_cuda_index,
)
from drivetrain.backend import batch_mover as nested_mover

ACCEPTED = (
    "'cpu', 'cuda', 'cuda:N', 'gpu', 'gpu:N', an int N (meaning cuda:N), a oneflow.device, "
    "or None (keep the model on the device it is on)"
)
SUPPORTED_TYPES = ("cpu", "cuda")
_TENSOR = flow.Tensor


def model_device(model: flow.nn.Module) -> flow.device:
    """The device of the model's first parameter or buffer; CPU for a model without any."""
    tensor = first_tensor(model)
    return flow.device("cpu") if tensor is None else tensor.device


def parse_device(device: Any, model: flow.nn.Module | None = None) -> flow.device:
    """``device=`` as a ``oneflow.device`` (type and index), without checking that a GPU exists."""
    if device is None:
        resolved = flow.device("cpu") if model is None else model_device(model)
        if resolved.type not in SUPPORTED_TYPES:
            raise DriverError(
                f"device=None keeps the model where it is, but the model is on {resolved}; the oneflow "
                f"driver supports {', '.join(SUPPORTED_TYPES)}. Pass device='cpu' or device='cuda'."
            )
        return resolved
    if isinstance(device, flow.device):
        return device
    parsed = parse_device_arg(device, ACCEPTED)
    if parsed is not None:
        kind, index = parsed
        return flow.device(kind) if index is None else flow.device(kind, index)
    if not isinstance(device, str):
        raise unaccepted_device(device, ACCEPTED)
    kind, _, index = device.strip().lower().partition(":")  # what is left: 'cpu:N', a bad index, another kind
    if kind not in ("cpu", "cuda", "gpu"):
        raise DriverError(
            f"device={device!r} is not a device the oneflow driver supports ({', '.join(SUPPORTED_TYPES)}); "
            f"accepted: {ACCEPTED}."
        )
    if index and not index.isdigit():
        raise DriverError(f"device={device!r}: {index!r} is not a device index; accepted: {ACCEPTED}.")
    return flow.device("cpu" if kind == "cpu" else "cuda")


def explicit_cuda(given: Any, device: flow.device) -> flow.device:
    """``device`` with its GPU index, after checking that oneflow can use that GPU (else a DriverError)."""
    return flow.device("cuda", usable_cuda_index(
        given, device.index, flow.cuda,
        f"device={given!r} asks for a GPU but oneflow.cuda.is_available() is False (no GPU is visible to this "
        f"process, or its driver does not fit this oneflow {flow.__version__} CUDA build); use device='cpu'. "
        "(Checked before moving anything: oneflow would abort the whole process on such a move.)"))


def resolve_device(device: Any, model: flow.nn.Module) -> flow.device:
    """Turn the user's ``device=`` into a checked ``oneflow.device`` (a CUDA one with its index)."""
    resolved = parse_device(device, model)
    if resolved.type == "cuda":
        resolved = explicit_cuda(device, resolved)
    return resolved


_NUMPY_KINDS = frozenset(np.dtype(t) for t in (np.float64, np.float32, np.float16, np.int64, np.int32, np.int8,
                                                 np.uint8, np.bool_))
"""numpy dtypes oneflow has a tensor dtype for; arrays of these are turned into tensors when a batch moves."""


def batch_mover(device: flow.device) -> Callable[[Any], Any]:
    """``move(batch)``: every oneflow tensor of a nested dict/list/tuple/namedtuple/dataclass batch on ``device``.

    numpy arrays of a dtype oneflow has (floats, int8/32/64, uint8, bool) become tensors on
    ``device``, so a plain iterable of numpy batches trains as is. Anything else passes
    unchanged; containers are rebuilt only when something inside moved
    (:func:`drivetrain.backend.batch_mover`). Where a tensor is, is read from ``is_cuda``
    (plus the index for a GPU): reading ``.device`` builds a device object, which costs
    more than the rest of the check on the per-batch path.
    """
    on_cpu, index = device.type == "cpu", device.index

    def in_place(tensor: Any) -> bool:
        return not tensor.is_cuda if on_cpu else tensor.is_cuda and tensor.device.index == index

    def to_device(value: Any) -> Any:
        if isinstance(value, np.ndarray):
            return flow.tensor(np.ascontiguousarray(value), device=device)
        return value.to(device)

    return nested_mover(_TENSOR, in_place, to_device, _movable)


def _movable(value: Any) -> bool:
    return isinstance(value, _TENSOR) or (isinstance(value, np.ndarray) and value.dtype in _NUMPY_KINDS)
