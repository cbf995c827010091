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
    check_file_tensor,
    dtype_tags,
    file_dtype_tag,
    load_module_state,
    module_gradients,
    tensor_from,
)
from drivetrain.backend import optimizer_state_for_load as _for_load


def model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's ``state_dict`` as a flat ``{name: tensor}`` dict.

    ``state_dict()`` already holds detached views of the live tensors: no copy, so a
    checkpoint writes the parameters straight from their memory.
    """
    return dict(model.state_dict())


def frozen_parameter_names(model: torch.nn.Module) -> set[str]:
    """The state names of the parameters with ``requires_grad=False`` (every name of a tied one)."""
    return {name for name, p in model.named_parameters(remove_duplicate=False) if not p.requires_grad}


def load_model_state(model: torch.nn.Module, state: Mapping[str, Any]) -> None:
    """Copy ``state`` into ``model``; names and shapes must match exactly (strict)."""
    load_module_state(model, state, as_tensor=as_tensor,
                      hint="(A state saved from a wrapped model, e.g. with a 'module.' or '_orig_mod.' prefix, "
                      "must be saved from the unwrapped model.)")


def as_tensor(value: Any, where: str) -> torch.Tensor:
    """A torch tensor from a torch tensor or a numpy array (checkpoints may hold either)."""
    return tensor_from(value, where, tensor_type=torch.Tensor, from_numpy=torch.from_numpy, framework="torch")


def _shape(tensor: torch.Tensor) -> tuple[int, ...]:
    return tuple(tensor.shape)


_DTYPES = dtype_tags(torch)
"""torch dtype -> safetensors tag, for the dtypes this torch version has."""


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
    check_file_tensor(tensor, torch.Tensor, "a torch tensor")
    if tensor.layout != torch.strided:
        raise DriverError(
            f"has layout {tensor.layout}; safetensors stores dense tensors only, convert it with .to_dense() first."
        )
    tag = file_dtype_tag(tensor.dtype, _DTYPES, "safetensors cannot store; convert it first")
    shape = tuple(tensor.shape)
    cpu = tensor.detach().to("cpu").resolve_conj().resolve_neg().contiguous()
    raw = cpu.reshape(-1).view(torch.uint8).numpy()  # the array keeps the tensor, hence its memory, alive
    return tag, shape, memoryview(raw)


def tensors_from_bytes(data: bytes) -> dict[str, torch.Tensor]:
    """Parse safetensors bytes into CPU tensors; the format is raw bytes plus JSON, so nothing is unpickled."""
    return safetensors.torch.load(bytes(data))


def gradient_copy(grad: torch.Tensor) -> torch.Tensor:
    """A CPU copy of a parameter's gradient (CPU so a checkpoint costs no GPU memory)."""
    if grad.layout != torch.strided:
        grad = grad.to_dense()  # safetensors has no sparse layout; loads back as a dense gradient
    return grad.to("cpu", copy=True)


def load_gradient_state(model: torch.nn.Module, grads: Mapping[str, Any]) -> None:
    """Give each named parameter its saved gradient (on the parameter's device and dtype), the others None."""
    params, prepared = module_gradients(
        model, grads, as_tensor=as_tensor,
        place=lambda grad, param: grad.detach().to(device=param.device, dtype=param.dtype, copy=True))
    for name, param in params.items():
        param.grad = prepared.get(name)


# torch keys optimizer state by parameter index; a JSON round trip turns the keys into strings
optimizer_state_for_load = functools.partial(_for_load, framework="torch")
