"""Model state and tensor files for the torch backend, without pickle.

Tensors go to disk through ``safetensors.torch``: the format holds raw bytes and
a JSON header, so loading a file can never run code from it. safetensors refuses
tensors that share memory (tied weights) and non-contiguous ones; :func:`save_tensors`
stores such tensors as independent contiguous copies, and loading them back into
the model re-ties nothing that was not tied, since ``load_state_dict`` copies into
the existing parameters.
"""

from __future__ import annotations

import os
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


def save_tensors(tensors: Mapping[str, Any], path: str | os.PathLike) -> None:
    """Write a flat ``{name: tensor}`` dict to ``path`` as a safetensors file (CPU, contiguous, no pickle).

    Tensors that share memory with an earlier one (tied weights, views) are written
    as copies: safetensors cannot express aliasing, and a copy loads back correctly.
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
    try:
        safetensors.torch.save_file(prepared, os.fspath(path))
    except ValueError as exc:  # safetensors' own checks; should not trigger after the preparation above
        raise DriverError(f"save_tensors could not write {os.fspath(path)!r}: {exc}") from exc


def load_tensors(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Read a safetensors file written by :func:`save_tensors` onto the CPU; never unpickles."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise DriverError(f"load_tensors: no file at {path!r}.")
    try:
        return safetensors.torch.load_file(path, device="cpu")
    except Exception as exc:  # safetensors raises its own SafetensorError for damaged headers
        raise DriverError(
            f"load_tensors: {path!r} is not a readable safetensors file ({type(exc).__name__}: {exc}); "
            "it may be truncated or damaged."
        ) from exc
