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

from collections.abc import Mapping
from typing import Any

import numpy as np
import oneflow as flow
import safetensors

from drivetrain.backend import (
    DriverError,
    array_buffer,
    bf16_bits,
    check_file_tensor,
    dtype_tags,
    file_dtype_tag,
    load_module_state,
    module_gradients,
    move_nested,
    tensor_from,
    widened_tensors,
)
from drivetrain.backend import optimizer_state_for_load as _for_load

_TAGS = dtype_tags(flow, ("float64", "float32", "float16", "bfloat16", "int64", "int32", "int8", "uint8", "bool"))


def _shape(tensor: flow.Tensor) -> tuple[int, ...]:
    return tuple(tensor.shape)


def as_tensor(value: Any, where: str) -> flow.Tensor:
    """A oneflow tensor from a oneflow tensor or a numpy array (checkpoints may hold either)."""
    return tensor_from(value, where, tensor_type=flow.Tensor, from_numpy=flow.tensor, framework="oneflow")


# ------------------------------------------------------------------------ model
def frozen_parameter_names(model: flow.nn.Module) -> set[str]:
    """The state names of the parameters with ``requires_grad=False``."""
    return {name for name, p in model.named_parameters() if not p.requires_grad}


def model_state(model: flow.nn.Module) -> dict[str, flow.Tensor]:
    """The model's ``state_dict`` (parameters and buffers) as a flat ``{name: tensor}`` dict, detached views."""
    return {name: tensor.detach() for name, tensor in model.state_dict().items()}


def load_model_state(model: flow.nn.Module, state: Mapping[str, Any]) -> None:
    """Copy ``state`` into ``model``; names and shapes must match exactly, dtypes are cast to the model's."""
    load_module_state(model, state, as_tensor=as_tensor, cast=lambda value, dtype: value.to(dtype))


# ------------------------------------------------------------------ tensor files
def tensor_buffer(tensor: Any) -> tuple[str, tuple[int, ...], memoryview]:
    """``(safetensors dtype tag, shape, C-contiguous bytes on the host)`` of a oneflow tensor or numpy array.

    A contiguous CPU tensor is handed over without a copy (its ``numpy()`` is a view that
    keeps the tensor alive); a GPU or non-contiguous tensor is copied once.
    """
    if isinstance(tensor, np.ndarray):
        return array_buffer(tensor)
    check_file_tensor(tensor, flow.Tensor, "a oneflow tensor")
    if not tensor.is_local:
        raise DriverError("is a global (consistent) oneflow tensor; convert it with .to_local() before saving.")
    tag = file_dtype_tag(tensor.dtype, _TAGS, "the oneflow driver cannot store; convert it first")
    shape = tuple(int(n) for n in tensor.shape)
    array = tensor.detach().cpu().contiguous().numpy()
    if tag == "BF16":  # numpy() widened it to float32 exactly: the bf16 bits are the upper 16
        array = bf16_bits(array)
    return tag, shape, array_buffer(array, tag)[2]


def tensors_from_bytes(data: bytes) -> dict[str, flow.Tensor]:
    """Parse safetensors bytes into CPU oneflow tensors (safetensors' own parser; nothing is unpickled)."""
    refusal = f"oneflow 0.9 has no dtype for; accepted: {sorted(_TAGS.values())}"
    return widened_tensors(safetensors.deserialize(bytes(data)), _TAGS.values(), refusal, flow.tensor,
                           lambda tensor: tensor.to(flow.bfloat16))  # flow.tensor: a copy oneflow owns


# --------------------------------------------------------------------- gradients
def gradient_copy(grad: flow.Tensor) -> flow.Tensor | None:
    """A CPU copy of a pending gradient, or None when it is all zeros (nothing accumulated).

    The drivers zero gradients in place rather than dropping them (see ``zero_grad``), so
    an all-zero gradient means "nothing accumulated" and is left out, as a missing one
    would be: a checkpoint between accumulation cycles then holds no gradients at all.
    """
    grad = grad.to("cpu").clone()
    if bool(grad.abs().sum().numpy() > 0) or not bool(flow.isfinite(grad).all().numpy()):
        return grad
    return None


def load_gradient_state(model: flow.nn.Module, grads: Mapping[str, Any], grad_slot: Any = None) -> None:
    """Give each named parameter its saved gradient (on the parameter's device and dtype), the others none.

    ``grad_slot(param)``, when given, returns the tensor a parameter's gradient must live
    in (data-parallel training keeps gradients in all-reduce buckets); the saved value is
    copied into it instead of replacing the gradient.
    """
    params, prepared = module_gradients(
        model, grads, as_tensor=as_tensor,
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
    return move_nested(value, lambda v: isinstance(v, flow.Tensor), lambda tensor: tensor.detach().clone())
