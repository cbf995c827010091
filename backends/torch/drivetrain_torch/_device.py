"""Devices for the torch backend: parse the user's ``device=`` once, and move batches there.

Everything that turns a user-supplied device into a ``torch.device`` lives here so
the rules (aliases, checks, messages) exist once. :func:`move_to_device` walks a
nested batch and rebuilds only the containers whose contents actually moved, so
a CPU batch on a CPU model costs one walk and no allocation.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping, MutableMapping
from typing import Any

import torch

from drivetrain._errors import DriverError

ACCEPTED = (
    "'cpu', 'cuda', 'cuda:N', 'gpu', 'gpu:N', an int N (meaning cuda:N), a torch.device, "
    "or None (keep the model on the device it is on)"
)
SUPPORTED_TYPES = ("cpu", "cuda")
_TENSOR = torch.Tensor  # one global lookup on the per-batch path instead of torch.Tensor's two


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of the model's first parameter or buffer; CPU for a model without any."""
    for tensor in model.parameters():
        return tensor.device
    for tensor in model.buffers():
        return tensor.device
    return torch.device("cpu")


def resolve_device(device: Any, model: torch.nn.Module) -> torch.device:
    """Turn the user's ``device=`` into a checked ``torch.device`` with an explicit CUDA index."""
    given = device
    if device is None:
        resolved = model_device(model)
        if resolved.type not in SUPPORTED_TYPES:
            raise DriverError(
                f"device=None keeps the model where it is, but the model is on {resolved}; the torch "
                f"driver supports {', '.join(SUPPORTED_TYPES)}. Pass device='cpu' or device='cuda'."
            )
    elif isinstance(device, bool):
        raise DriverError(f"device={given!r} is not a device; accepted: {ACCEPTED}.")
    elif isinstance(device, int):
        if device < 0:
            raise DriverError(f"device={given!r}: a GPU index must be >= 0; accepted: {ACCEPTED}.")
        resolved = torch.device("cuda", device)
    elif isinstance(device, str):
        text = device.strip().lower()
        if text == "gpu" or text.startswith("gpu:"):
            text = "cuda" + text[3:]
        try:
            resolved = torch.device(text)
        except (RuntimeError, ValueError):
            raise DriverError(
                f"device={given!r} is not a device torch understands; accepted: {ACCEPTED}."
            ) from None
    elif isinstance(device, torch.device):
        resolved = device
    else:
        raise DriverError(
            f"device={given!r} (a {type(given).__name__}) is not accepted; accepted: {ACCEPTED}."
        )
    if resolved.type not in SUPPORTED_TYPES:
        raise DriverError(
            f"device={given!r} is a {resolved.type!r} device; the torch driver supports "
            f"{', '.join(SUPPORTED_TYPES)}. Accepted: {ACCEPTED}."
        )
    if resolved.type == "cuda":
        resolved = _check_cuda(given, resolved)
    return resolved


def _check_cuda(given: Any, device: torch.device) -> torch.device:
    if not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU-only"
        raise DriverError(
            f"device={given!r} asks for a GPU but torch.cuda.is_available() is False (this torch build is "
            f"{build} (torch {torch.__version__}), or no GPU is visible to this process); "
            "use device='cpu', or install a CUDA build of torch on a machine with a GPU."
        )
    count = torch.cuda.device_count()
    index = torch.cuda.current_device() if device.index is None else device.index
    if index >= count:
        raise DriverError(
            f"device={given!r}: cuda:{index} does not exist, this process sees {count} CUDA device(s) "
            f"(valid: {', '.join(f'cuda:{i}' for i in range(count))}). Check CUDA_VISIBLE_DEVICES."
        )
    return torch.device("cuda", index)


def move_to_device(batch: Any, device: torch.device, non_blocking: bool = False) -> Any:
    """Move every tensor in a nested dict/list/tuple/namedtuple/dataclass to ``device``.

    Non-tensors are returned unchanged. A container is rebuilt (as a new object of
    the same kind) only when something inside it moved; otherwise the very same
    object comes back, which keeps the common CPU case allocation-free.
    """
    if type(batch) is dict:  # the usual batch, a dict of tensors already there: checked without recursion
        for value in batch.values():
            if type(value) is not _TENSOR or value.device != device:
                break
        else:
            return batch
    if isinstance(batch, torch.Tensor):
        if batch.device == device:
            return batch
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, (str, bytes, int, float, type(None))):
        return batch
    if isinstance(batch, Mapping):
        changed = {}
        for key, value in batch.items():
            moved = move_to_device(value, device, non_blocking)
            if moved is not value:
                changed[key] = moved
        if not changed:
            return batch
        if type(batch) is dict:
            return {key: changed.get(key, value) for key, value in batch.items()}
        if isinstance(batch, MutableMapping):
            out = copy.copy(batch)  # keeps the mapping's class and extras (defaultdict factory, ...)
            out.update(changed)
            return out
        return {key: changed.get(key, value) for key, value in batch.items()}
    if isinstance(batch, (list, tuple)):
        items = [move_to_device(value, device, non_blocking) for value in batch]
        if all(new is old for new, old in zip(items, batch, strict=True)):
            return batch
        if isinstance(batch, tuple):
            if hasattr(batch, "_fields"):  # namedtuple
                return type(batch)(*items)
            return tuple(items) if type(batch) is tuple else type(batch)(items)
        return items if type(batch) is list else type(batch)(items)
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        changed = {}
        for f in dataclasses.fields(batch):
            value = getattr(batch, f.name)
            moved = move_to_device(value, device, non_blocking)
            if moved is not value:
                changed[f.name] = moved
        if not changed:
            return batch
        out = copy.copy(batch)  # a new instance; works for frozen dataclasses and init=False fields
        for name, value in changed.items():
            object.__setattr__(out, name, value)
        return out
    return batch
