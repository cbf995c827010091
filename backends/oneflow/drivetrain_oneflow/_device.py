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

from drivetrain.backend import DriverError, checked_cuda_index, move_nested

ACCEPTED = (
    "'cpu', 'cuda', 'cuda:N', 'gpu', 'gpu:N', an int N (meaning cuda:N), a oneflow.device, "
    "or None (keep the model on the device it is on)"
)
SUPPORTED_TYPES = ("cpu", "cuda")
_TENSOR = flow.Tensor


def model_device(model: flow.nn.Module) -> flow.device:
    """The device of the model's first parameter or buffer; CPU for a model without any."""
    for tensor in model.parameters():
        return tensor.device
    for tensor in model.buffers():
        return tensor.device
    return flow.device("cpu")


def parse_device(device: Any, model: flow.nn.Module | None = None) -> flow.device:
    """``device=`` as a ``oneflow.device`` (type and index), without checking that a GPU exists."""
    given = device
    if device is None:
        if model is None:
            return flow.device("cpu")
        resolved = model_device(model)
        if resolved.type not in SUPPORTED_TYPES:
            raise DriverError(
                f"device=None keeps the model where it is, but the model is on {resolved}; the oneflow "
                f"driver supports {', '.join(SUPPORTED_TYPES)}. Pass device='cpu' or device='cuda'."
            )
        return resolved
    if isinstance(device, bool):
        raise DriverError(f"device={given!r} is not a device; accepted: {ACCEPTED}.")
    if isinstance(device, int):
        if device < 0:
            raise DriverError(f"device={given!r}: a GPU index must be >= 0; accepted: {ACCEPTED}.")
        return flow.device("cuda", device)
    if isinstance(device, flow.device):
        return device
    if not isinstance(device, str):
        raise DriverError(f"device={given!r} (a {type(given).__name__}) is not accepted; accepted: {ACCEPTED}.")
    text = device.strip().lower()
    if text == "gpu" or text.startswith("gpu:"):
        text = "cuda" + text[3:]
    kind, _, index = text.partition(":")
    if kind not in SUPPORTED_TYPES:
        raise DriverError(
            f"device={given!r} is not a device the oneflow driver supports ({', '.join(SUPPORTED_TYPES)}); "
            f"accepted: {ACCEPTED}."
        )
    if index and not index.isdigit():
        raise DriverError(f"device={given!r}: {index!r} is not a device index; accepted: {ACCEPTED}.")
    if kind == "cpu":
        return flow.device("cpu")
    return flow.device("cuda", int(index)) if index else flow.device("cuda")


def explicit_cuda(given: Any, device: flow.device) -> flow.device:
    """``device`` with its GPU index, after checking that oneflow can use that GPU (else a DriverError)."""
    if not flow.cuda.is_available():
        raise DriverError(
            f"device={given!r} asks for a GPU but oneflow.cuda.is_available() is False (no GPU is visible to this "
            f"process, or its driver does not fit this oneflow {flow.__version__} CUDA build); use device='cpu'. "
            "(Checked before moving anything: oneflow would abort the whole process on such a move.)"
        )
    return flow.device("cuda", checked_cuda_index(given, device.index, flow.cuda.device_count(),
                                                  flow.cuda.current_device))


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
    (:func:`drivetrain.backend.move_nested`). Where a tensor is, is read from ``is_cuda``
    (plus the index for a GPU): reading ``.device`` builds a device object, which costs
    more than the rest of the check on the per-batch path.
    """
    on_cpu, index = device.type == "cpu", device.index

    def in_place(tensor: Any) -> bool:
        if on_cpu:
            return not tensor.is_cuda
        return tensor.is_cuda and tensor.device.index == index

    def move(value: Any) -> Any:
        if isinstance(value, np.ndarray):
            return flow.tensor(np.ascontiguousarray(value), device=device)
        return value if in_place(value) else value.to(device)

    def move_batch(batch: Any) -> Any:
        if type(batch) is dict:  # the usual batch, tensors already there: checked without recursion
            for value in batch.values():
                if type(value) is not _TENSOR or (value.is_cuda if on_cpu else not in_place(value)):
                    break
            else:
                return batch
        return move_nested(batch, _movable, move)

    return move_batch


def _movable(value: Any) -> bool:
    return isinstance(value, _TENSOR) or (isinstance(value, np.ndarray) and value.dtype in _NUMPY_KINDS)
