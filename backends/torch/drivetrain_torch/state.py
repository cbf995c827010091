"""Model state and tensor files for the torch backend, without pickle.

Tensors go to disk as safetensors: raw bytes and a JSON header, so loading a file
can never run code from it. The core's writer streams each tensor's memory into the
file (:func:`tensor_buffer` hands it over); files are read with ``safetensors.torch``.
Tensors that share memory (tied weights) are stored as independent copies, and
loading them back re-ties nothing that was not tied, since ``load_state_dict`` copies
into the existing parameters.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import safetensors.torch
import torch

from drivetrain.backend import (
    DriverError,
    array_buffer,
    check_gradient_names,
    check_gradient_shape,
    check_state_names,
    check_state_shape,
)


def model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's ``state_dict`` as a flat ``{name: tensor}`` dict.

    ``state_dict()`` already holds detached views of the live tensors: no copy, so a
    checkpoint writes the parameters straight from their memory.
    """
    return dict(model.state_dict())


def load_model_state(model: torch.nn.Module, state: Mapping[str, Any]) -> None:
    """Copy ``state`` into ``model``; names and shapes must match exactly (strict)."""
    expected = model.state_dict()
    check_state_names(state, expected, type(model).__name__,
                      hint="(A state saved from a wrapped model, e.g. with a 'module.' or '_orig_mod.' prefix, "
                      "must be saved from the unwrapped model.)")
    tensors: dict[str, torch.Tensor] = {}
    for name, target in expected.items():
        value = state[name]
        if isinstance(value, np.ndarray):
            value = torch.from_numpy(np.ascontiguousarray(value))
        if not isinstance(value, torch.Tensor):
            raise DriverError(
                f"state[{name!r}] is a {type(value).__name__}; load_model_state needs torch tensors "
                "(or numpy arrays)."
            )
        check_state_shape(name, tuple(value.shape), tuple(target.shape))
        tensors[name] = value
    model.load_state_dict(tensors, strict=True)


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
    check_gradient_names(grads, params, type(model).__name__)
    prepared = {name: _gradient_for(params[name], name, value) for name, value in grads.items()}
    for name, param in params.items():
        param.grad = prepared.get(name)


def _gradient_for(param: torch.nn.Parameter, name: str, value: Any) -> torch.Tensor:
    if isinstance(value, np.ndarray):
        value = torch.from_numpy(np.ascontiguousarray(value))
    if not isinstance(value, torch.Tensor):
        raise DriverError(f"load_gradient_state: grads[{name!r}] is a {type(value).__name__}, not a tensor.")
    check_gradient_shape(name, tuple(value.shape), tuple(param.shape))
    return value.detach().to(device=param.device, dtype=param.dtype, copy=True)


def optimizer_state_for_load(state: Any, where: str) -> dict[str, Any]:
    """``state`` with its per-parameter keys as ints again, checked against its own param groups.

    torch keys optimizer state by parameter index (an int); a JSON round trip turns
    those keys into strings, and ``Optimizer.load_state_dict`` would then keep them
    as unrelated entries: the optimizer would silently restart its moments.
    """
    if not isinstance(state, Mapping) or "state" not in state or "param_groups" not in state:
        raise DriverError(
            f"{where} is a {type(state).__name__} without 'state' and 'param_groups'; it must be a "
            "torch optimizer's state_dict(), as optimizer_states() returns."
        )
    indices = {index for group in state["param_groups"] for index in group.get("params", [])}
    per_param: dict[Any, Any] = {}
    for key, value in state["state"].items():
        index = int(key) if isinstance(key, str) and key.isdigit() else key
        if index not in indices:
            raise DriverError(
                f"{where}['state'] has an entry for parameter {key!r}, which none of its param_groups lists; "
                "the optimizer state is damaged or was not produced by optimizer_states()."
            )
        per_param[index] = value
    return {**state, "state": per_param}
