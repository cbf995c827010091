"""Devices for the torch backend: parse the user's ``device=`` once, and move batches there.

Everything that turns a user-supplied device into a ``torch.device`` lives here so
the rules (aliases, checks, messages) exist once. :func:`move_to_device` moves
nested batches with the core's :func:`drivetrain.backend.move_nested`.
"""

from __future__ import annotations

from typing import Any

import torch

from drivetrain.backend import (
    DriverError,
    first_tensor,
    move_nested,
    parse_device_arg,
    unaccepted_device,
    usable_cuda_index,
)

ACCEPTED = (
    "'cpu', 'cuda', 'cuda:N', 'gpu', 'gpu:N', an int N (meaning cuda:N), a torch.device, "
    "or None (keep the model on the device it is on)"
)
SUPPORTED_TYPES = ("cpu", "cuda")
_TENSOR = torch.Tensor  # one global lookup on the per-batch path instead of torch.Tensor's two


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of the model's first parameter or buffer; CPU for a model without any."""
    tensor = first_tensor(model)
    return torch.device("cpu") if tensor is None else tensor.device


def resolve_device(device: Any, model: torch.nn.Module) -> torch.device:
    """Turn the user's ``device=`` into a checked ``torch.device`` with an explicit CUDA index."""
    if device is None:
        resolved = model_device(model)
        if resolved.type not in SUPPORTED_TYPES:
            raise DriverError(
                f"device=None keeps the model where it is, but the model is on {resolved}; the torch "
                f"driver supports {', '.join(SUPPORTED_TYPES)}. Pass device='cpu' or device='cuda'."
            )
    else:
        resolved = parse_device(device)
    if resolved.type == "cuda":
        resolved = _check_cuda(device, resolved)
    return resolved


def parse_device(device: Any) -> torch.device:
    """The ``torch.device`` a ``device=`` spelling names (cpu or cuda, the index as given), or a DriverError."""
    parsed = parse_device_arg(device, ACCEPTED)
    if parsed is not None:
        return torch.device(*parsed)
    if isinstance(device, torch.device):
        resolved = device
    elif isinstance(device, str):
        try:
            resolved = torch.device(device.strip().lower())
        except (RuntimeError, ValueError):
            raise DriverError(f"device={device!r} is not a device torch understands; accepted: {ACCEPTED}.") from None
    else:
        raise unaccepted_device(device, ACCEPTED)
    if resolved.type not in SUPPORTED_TYPES:
        raise DriverError(
            f"device={device!r} is a {resolved.type!r} device; the torch driver supports "
            f"{', '.join(SUPPORTED_TYPES)}. Accepted: {ACCEPTED}."
        )
    return resolved


def _check_cuda(given: Any, device: torch.device) -> torch.device:
    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU-only"
    return torch.device("cuda", usable_cuda_index(
        given, device.index, torch.cuda,
        f"device={given!r} asks for a GPU but torch.cuda.is_available() is False (this torch build is {build} "
        f"(torch {torch.__version__}), or no GPU is visible to this process); use device='cpu', or install a "
        "CUDA build of torch on a machine with a GPU."))


def move_to_device(batch: Any, device: torch.device, non_blocking: bool = False) -> Any:
    """Move every tensor in a nested dict/list/tuple/namedtuple/dataclass to ``device``.

    Non-tensors are returned unchanged; containers are rebuilt only when something inside
    moved (:func:`drivetrain.backend.move_nested`), so a CPU batch on a CPU model costs one
    walk and no allocation.
    """
    if type(batch) is dict:  # the usual batch, a dict of tensors already there: checked without recursion
        for value in batch.values():
            if type(value) is not _TENSOR or value.device != device:
                break
        else:
            return batch

    def move(tensor: torch.Tensor) -> torch.Tensor:
        return tensor if tensor.device == device else tensor.to(device, non_blocking=non_blocking)

    return move_nested(batch, _is_tensor, move)


def _is_tensor(value: Any) -> bool:
    return isinstance(value, _TENSOR)
