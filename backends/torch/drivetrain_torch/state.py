"""Model state and tensor files for the torch backend, without pickle.

Tensors go to disk through ``safetensors.torch``: the format holds raw bytes and
a JSON header, so loading a file can never run code from it. safetensors refuses
tensors that share memory (tied weights) and non-contiguous ones; :func:`tensors_to_bytes`
stores such tensors as independent contiguous copies, and loading them back into
the model re-ties nothing that was not tied, since ``load_state_dict`` copies into
the existing parameters.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import safetensors.torch
import torch

from drivetrain._errors import DriverError

_MAX_LISTED = 10


def model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's ``state_dict`` as a flat ``{name: tensor}`` dict of detached tensors."""
    return {name: tensor.detach() for name, tensor in model.state_dict().items()}


def _listed(names: list[str]) -> str:
    shown = ", ".join(repr(n) for n in names[:_MAX_LISTED])
    more = len(names) - _MAX_LISTED
    return f"[{shown}{f', ... {more} more' if more > 0 else ''}]"


def load_model_state(model: torch.nn.Module, state: Mapping[str, Any]) -> None:
    """Copy ``state`` into ``model``; names and shapes must match exactly (strict)."""
    if not isinstance(state, Mapping):
        raise DriverError(
            f"load_model_state(state={type(state).__name__}) needs a dict of name -> tensor, "
            "as returned by model_state() or load_tensors()."
        )
    expected = model.state_dict()
    missing = [name for name in expected if name not in state]
    unexpected = [name for name in state if name not in expected]
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing key(s) {_listed(missing)}")
        if unexpected:
            parts.append(f"unexpected key(s) {_listed(unexpected)}")
        raise DriverError(
            f"The state does not fit the model {type(model).__name__}: {'; '.join(parts)}. "
            "Was it saved from a different model class or architecture? (A state saved from a wrapped "
            "model, e.g. with a 'module.' or '_orig_mod.' prefix, must be saved from the unwrapped model.)"
        )
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
        if value.shape != target.shape:
            raise DriverError(
                f"state[{name!r}] has shape {tuple(value.shape)} but the model's {name!r} has shape "
                f"{tuple(target.shape)}; the state was saved from a differently sized model."
            )
        tensors[name] = value
    model.load_state_dict(tensors, strict=True)


def _storage_key(tensor: torch.Tensor) -> tuple[str, int] | None:
    if tensor.numel() == 0:
        return None
    return (str(tensor.device), tensor.untyped_storage().data_ptr())


def _prepare(tensors: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """Detached, contiguous CPU tensors that own their memory, as safetensors requires.

    Tensors that share memory with an earlier one (tied weights, views) become
    copies: safetensors cannot express aliasing, and a copy loads back correctly.
    """
    if not isinstance(tensors, Mapping):
        raise DriverError(f"save_tensors(tensors={type(tensors).__name__}) needs a dict of name -> tensor.")
    seen: set[tuple[str, int]] = set()
    prepared: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        if not isinstance(name, str):
            raise DriverError(
                f"save_tensors: key {name!r} is a {type(name).__name__}; tensor names must be str."
            )
        if isinstance(tensor, np.ndarray):
            tensor = torch.from_numpy(np.ascontiguousarray(tensor))
        if not isinstance(tensor, torch.Tensor):
            raise DriverError(
                f"save_tensors: {name!r} is a {type(tensor).__name__}, not a torch tensor; put only tensors "
                "in a tensor file (other values belong in the checkpoint's JSON manifest)."
            )
        if tensor.layout != torch.strided:
            raise DriverError(
                f"save_tensors: {name!r} has layout {tensor.layout}; safetensors stores dense tensors only, "
                "convert it with .to_dense() first."
            )
        tensor = tensor.detach()
        key = _storage_key(tensor)
        shared = key is not None and key in seen
        if key is not None:
            seen.add(key)
        if tensor.device.type != "cpu":
            tensor = tensor.cpu()  # a fresh buffer: no longer shared
        elif shared:
            tensor = tensor.clone(memory_format=torch.contiguous_format)
        if not tensor.is_contiguous():
            tensor = tensor.contiguous()
        prepared[name] = tensor
    return prepared


def tensors_to_bytes(tensors: Mapping[str, Any]) -> bytes:
    """A flat ``{name: tensor}`` dict as safetensors bytes (CPU, contiguous, no pickle; bit-exact dtypes)."""
    prepared = _prepare(tensors)
    try:
        return safetensors.torch.save(prepared)
    except ValueError as exc:  # safetensors' own checks; should not trigger after the preparation above
        raise DriverError(f"save_tensors could not serialise the tensors: {exc}") from exc


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
    if not isinstance(grads, Mapping):
        raise DriverError(
            f"load_gradient_state(grads={type(grads).__name__}) needs a dict of parameter name -> tensor, "
            "as returned by gradient_state()."
        )
    params = dict(model.named_parameters())
    unknown = [name for name in grads if name not in params]
    if unknown:
        raise DriverError(
            f"load_gradient_state: the model {type(model).__name__} has no parameter(s) {_listed(unknown)}; "
            "the gradients were saved from a different model."
        )
    prepared = {name: _gradient_for(params[name], name, value) for name, value in grads.items()}
    for name, param in params.items():
        param.grad = prepared.get(name)


def _gradient_for(param: torch.nn.Parameter, name: str, value: Any) -> torch.Tensor:
    if isinstance(value, np.ndarray):
        value = torch.from_numpy(np.ascontiguousarray(value))
    if not isinstance(value, torch.Tensor):
        raise DriverError(f"load_gradient_state: grads[{name!r}] is a {type(value).__name__}, not a tensor.")
    if value.shape != param.shape:
        raise DriverError(
            f"load_gradient_state: grads[{name!r}] has shape {tuple(value.shape)} but the parameter has shape "
            f"{tuple(param.shape)}; the gradients were saved from a differently sized model."
        )
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
