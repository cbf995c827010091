"""Model state and tensor files for the torch backend, without pickle.

Tensors go to disk as safetensors: raw bytes and a JSON header, so loading a file
can never run code from it. The core's writer streams each tensor's memory into the
file (:func:`tensor_buffer` hands it over); files are read with ``safetensors.torch``.
Tensors that share memory (tied weights) are stored as independent copies, and
loading them back re-ties nothing that was not tied, since ``load_state_dict`` copies
into the existing parameters.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import numpy as np
import safetensors.torch
import torch

from drivetrain.backend import (
    DriverError,
    array_buffer,
    loadable_gradients,
    loadable_model_state,
)
from drivetrain.backend import optimizer_state_for_load as _for_load


def model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's ``state_dict`` as a flat ``{name: tensor}`` dict.

    ``state_dict()`` already holds detached views of the live tensors: no copy, so a
    checkpoint writes the parameters straight from their memory.
    """
    return dict(model.state_dict())


def load_model_state(model: torch.nn.Module, state: Mapping[str, Any]) -> None:
    """Copy ``state`` into ``model``; names and shapes must match exactly (strict)."""
    tensors = loadable_model_state(
        state, model.state_dict(), type(model).__name__, as_tensor=as_tensor, shape=_shape,
        hint="(A state saved from a wrapped model, e.g. with a 'module.' or '_orig_mod.' prefix, "
        "must be saved from the unwrapped model.)")
    model.load_state_dict(tensors, strict=True)


def as_tensor(value: Any, where: str) -> torch.Tensor:
    """A torch tensor from a torch tensor or a numpy array (checkpoints may hold either)."""
    if isinstance(value, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(value))
    if not isinstance(value, torch.Tensor):
        raise DriverError(f"{where} is a {type(value).__name__}; the torch driver needs torch tensors (or numpy arrays).")
    return value


def _shape(tensor: torch.Tensor) -> tuple[int, ...]:
    return tuple(tensor.shape)


def _safetensors_dtypes() -> dict[torch.dtype, str]:
    """torch dtype -> safetensors tag, for the dtypes this torch version has."""
    names = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16", "complex64": "C64",
             "int64": "I64", "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL",
             "uint64": "U64", "uint32": "U32", "uint16": "U16", "float8_e4m3fn": "F8_E4M3",
             "float8_e5m2": "F8_E5M2", "float8_e4m3fnuz": "F8_E4M3FNUZ", "float8_e5m2fnuz": "F8_E5M2FNUZ",
             "float8_e8m0fnu": "F8_E8M0"}
    return {getattr(torch, name): tag for name, tag in names.items() if hasattr(torch, name)}


_DTYPES = _safetensors_dtypes()


def tensor_buffer(tensor: Any) -> tuple[str, tuple[int, ...], memoryview]:
    """``(safetensors dtype, shape, bytes)`` of one tensor, for the core's streaming writer.

    The bytes are a view of the tensor's own memory when it is a contiguous CPU tensor;
    a GPU tensor is copied to the CPU and a non-contiguous one made contiguous first.
    Tensors sharing memory (tied weights, views) need no care: each is written in
    full, and loading copies into the model's parameters, so nothing gets re-tied.
    Every dtype goes over as raw bytes (numpy has no bf16 or float8): bit-exact.
    """
    if isinstance(tensor, np.ndarray):
        return array_buffer(tensor)
    if not isinstance(tensor, torch.Tensor):
        raise DriverError(
            f"is a {type(tensor).__name__}, not a torch tensor; put only tensors in a tensor file (other values "
            "belong in the checkpoint's JSON manifest)."
        )
    if tensor.layout != torch.strided:
        raise DriverError(
            f"has layout {tensor.layout}; safetensors stores dense tensors only, convert it with .to_dense() first."
        )
    tag = _DTYPES.get(tensor.dtype)
    if tag is None:
        raise DriverError(f"has dtype {tensor.dtype}, which safetensors cannot store; convert it first.")
    shape = tuple(tensor.shape)
    cpu = tensor.detach().to("cpu").resolve_conj().resolve_neg().contiguous()
    raw = cpu.reshape(-1).view(torch.uint8).numpy()  # the array keeps the tensor, hence its memory, alive
    return tag, shape, memoryview(raw)


def tensors_from_bytes(data: bytes) -> dict[str, torch.Tensor]:
    """Parse safetensors bytes into CPU tensors; the format is raw bytes plus JSON, so nothing is unpickled."""
    return safetensors.torch.load(bytes(data))


def gradient_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """CPU copies of the existing gradients by parameter name (CPU so a checkpoint costs no GPU memory)."""
    grads: dict[str, torch.Tensor] = {}
    for name, param in model.named_parameters():
        grad = param.grad
        if grad is None:
            continue
        grad = grad.detach()
        if grad.layout != torch.strided:
            grad = grad.to_dense()  # safetensors has no sparse layout; loads back as a dense gradient
        grads[name] = grad.to("cpu", copy=True)
    return grads


def load_gradient_state(model: torch.nn.Module, grads: Mapping[str, Any]) -> None:
    """Give each named parameter its saved gradient (on the parameter's device and dtype), the others None."""
    params = dict(model.named_parameters())
    prepared = loadable_gradients(grads, params, type(model).__name__, as_tensor=as_tensor, shape=_shape,
                                  place=lambda grad, param: grad.detach().to(device=param.device, dtype=param.dtype,
                                                                             copy=True))
    for name, param in params.items():
        param.grad = prepared.get(name)


# torch keys optimizer state by parameter index; a JSON round trip turns the keys into strings
optimizer_state_for_load = functools.partial(_for_load, framework="torch")
