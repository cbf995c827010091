"""Model, gradient and optimizer state for the oneflow backend, and tensor files, without pickle.

``oneflow.save`` writes a directory of oneflow's own making (and pickles Python
objects); it is never used. Tensors go to disk as safetensors (raw bytes plus a JSON
header, so reading a file never runs code): :func:`tensor_buffer` hands each tensor's
bytes to the core's writer, straight from the tensor's memory for a contiguous CPU
tensor, and :func:`tensors_from_bytes` parses them back with safetensors' own parser.

oneflow 0.9 cannot reinterpret a tensor's bits (no ``Tensor.view(dtype)``) and its
``numpy()`` turns bfloat16 into float32. bfloat16 is the upper half of a float32, and
that conversion is exact, so the bf16 bits are recovered from the float32 value and
written as such: bfloat16 round-trips bit-exactly.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import oneflow as flow
import safetensors

from drivetrain.backend import (
    DriverError,
    array_buffer,
    loadable_gradients,
    loadable_model_state,
)
from drivetrain.backend import optimizer_state_for_load as _for_load

_TAGS: dict[Any, str] = {
    flow.float64: "F64", flow.float32: "F32", flow.float16: "F16", flow.bfloat16: "BF16",
    flow.int64: "I64", flow.int32: "I32", flow.int8: "I8", flow.uint8: "U8", flow.bool: "BOOL",
}
_READ: dict[str, Any] = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64,
                         "I32": np.int32, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_, "BF16": np.uint16}
_ITEM_SIZES = {"F64": 8, "I64": 8, "F32": 4, "I32": 4, "F16": 2, "BF16": 2, "I8": 1, "U8": 1, "BOOL": 1}


def _shape(tensor: flow.Tensor) -> tuple[int, ...]:
    return tuple(tensor.shape)


def as_tensor(value: Any, where: str) -> flow.Tensor:
    """A oneflow tensor from a oneflow tensor or a numpy array (checkpoints may hold either)."""
    if isinstance(value, flow.Tensor):
        return value
    if isinstance(value, np.ndarray):
        return flow.tensor(np.ascontiguousarray(value))
    raise DriverError(f"{where} is a {type(value).__name__}; the oneflow driver needs oneflow tensors (or numpy arrays).")


# ------------------------------------------------------------------------ model
def model_state(model: flow.nn.Module) -> dict[str, flow.Tensor]:
    """The model's ``state_dict`` (parameters and buffers) as a flat ``{name: tensor}`` dict, detached views."""
    return {name: tensor.detach() for name, tensor in model.state_dict().items()}


def load_model_state(model: flow.nn.Module, state: Mapping[str, Any]) -> None:
    """Copy ``state`` into ``model``; names and shapes must match exactly, dtypes are cast to the model's."""
    prepared = loadable_model_state(state, model.state_dict(), type(model).__name__, as_tensor=as_tensor,
                                    shape=_shape, cast=lambda value, dtype: value.to(dtype))
    model.load_state_dict(prepared, strict=True)  # copies into the existing tensors: optimizers stay valid


# ------------------------------------------------------------------ tensor files
def tensor_buffer(tensor: Any) -> tuple[str, tuple[int, ...], memoryview]:
    """``(safetensors dtype tag, shape, C-contiguous bytes on the host)`` of a oneflow tensor or numpy array.

    A contiguous CPU tensor is handed over without a copy (its ``numpy()`` is a view that
    keeps the tensor alive); a GPU or non-contiguous tensor is copied once.
    """
    if isinstance(tensor, np.ndarray):
        return array_buffer(tensor)
    if not isinstance(tensor, flow.Tensor):
        raise DriverError(
            f"is a {type(tensor).__name__}, not a oneflow tensor; put only tensors in a tensor file "
            "(other values belong in the checkpoint's JSON manifest)."
        )
    if not tensor.is_local:
        raise DriverError("is a global (consistent) oneflow tensor; convert it with .to_local() before saving.")
    tag = _TAGS.get(tensor.dtype)
    if tag is None:
        raise DriverError(f"has dtype {tensor.dtype}, which the oneflow driver cannot store; convert it first.")
    shape = tuple(int(n) for n in tensor.shape)
    tensor = tensor.detach()
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()
    if not tensor.is_contiguous():
        tensor = tensor.contiguous()
    array = tensor.numpy()
    if tag == "BF16":  # numpy() widened it to float32 exactly: the bf16 bits are the upper 16
        array = (np.ascontiguousarray(array, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)
    array = np.ascontiguousarray(array)
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    return tag, shape, memoryview(array.reshape(-1).view(np.uint8))


def tensors_from_bytes(data: bytes) -> dict[str, flow.Tensor]:
    """Parse safetensors bytes into CPU oneflow tensors (safetensors' own parser; nothing is unpickled)."""
    out: dict[str, flow.Tensor] = {}
    for name, info in safetensors.deserialize(bytes(data)):
        tag = info["dtype"]
        if tag not in _READ:
            raise DriverError(
                f"tensor {name!r} has dtype {tag}, which oneflow 0.9 has no dtype for; accepted: {sorted(_READ)}."
            )
        shape = [int(n) for n in info["shape"]]
        raw = info["data"]
        if len(raw) != math.prod(shape) * _ITEM_SIZES[tag]:
            raise DriverError(f"tensor {name!r}: {len(raw)} bytes do not fit dtype {tag} and shape {shape}.")
        array = np.frombuffer(raw, dtype=np.dtype(_READ[tag]).newbyteorder("<")).reshape(shape)
        if tag == "BF16":  # widen the bits to float32 (exact), then narrow in oneflow (exact again)
            widened = (array.astype(np.uint32) << 16).view(np.float32)
            out[name] = flow.tensor(widened).to(flow.bfloat16)
        else:
            out[name] = flow.tensor(array.astype(array.dtype.newbyteorder("=")))  # a copy oneflow owns
    return out


# --------------------------------------------------------------------- gradients
def gradient_state(model: flow.nn.Module) -> dict[str, flow.Tensor]:
    """Copies of the pending gradients by parameter name, on the CPU.

    The drivers zero gradients in place rather than dropping them (see ``zero_grad``), so
    an all-zero gradient means "nothing accumulated" and is left out, as a missing one
    would be: a checkpoint between accumulation cycles then holds no gradients at all.
    """
    grads: dict[str, flow.Tensor] = {}
    for name, param in model.named_parameters():
        grad = param.grad
        if grad is None:
            continue
        grad = grad.detach().to("cpu").clone()
        if bool(grad.abs().sum().numpy() > 0) or not bool(flow.isfinite(grad).all().numpy()):
            grads[name] = grad
    return grads


def load_gradient_state(model: flow.nn.Module, grads: Mapping[str, Any], grad_slot: Any = None) -> None:
    """Give each named parameter its saved gradient (on the parameter's device and dtype), the others none.

    ``grad_slot(param)``, when given, returns the tensor a parameter's gradient must live
    in (data-parallel training keeps gradients in all-reduce buckets); the saved value is
    copied into it instead of replacing the gradient.
    """
    params = dict(model.named_parameters())
    prepared = loadable_gradients(grads, params, type(model).__name__, as_tensor=as_tensor, shape=_shape,
                                  place=lambda grad, param: grad.detach().to(device=param.device, dtype=param.dtype))
    with flow.no_grad():
        for name, param in params.items():
            value = prepared.get(name)
            slot = grad_slot(param) if grad_slot is not None else None
            if slot is not None:
                slot.copy_(value if value is not None else flow.zeros_like(slot))
            else:
                param.grad = None if value is None else value.clone()


# --------------------------------------------------------------------- optimizers
def optimizer_state_for_load(state: Any, where: str) -> dict[str, Any]:
    """``state`` with its per-parameter keys as ints again, checked against its own param groups.

    oneflow keys optimizer state by parameter index (an int) next to plain entries such
    as ``"step"``. Tensors are cloned: oneflow's ``load_state_dict`` keeps the very
    tensors it is given and its optimizers update them in place, so a state taken from a
    live optimizer would otherwise be shared by two optimizers.
    """
    return _for_load(state, where, "oneflow", plain_entries=True, copy=_cloned)


def _cloned(value: Any) -> Any:
    if isinstance(value, flow.Tensor):
        return value.detach().clone()
    if isinstance(value, Mapping):
        return {key: _cloned(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_cloned(item) for item in value)
    return value
