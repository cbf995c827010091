"""The framework-free part of a backend's ``device=``: the common spellings, their errors, and moving batches.

Every backend accepts the same words for a device (``'cpu'``, ``'cuda'``/``'gpu'`` with an
optional ``:N``, an int N for GPU N) and refuses a bool, a negative index and an object of
another type with the same sentences. A backend adds its own device classes and its own
words for a string it does not know; everything else is here, once.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any

import numpy as np

from .._common import DriverError
from ._checks import checked_cuda_index

OTHER_DEVICE_KINDS = ("xpu", "npu", "mlu", "ipu", "mps", "tpu", "xla")
"""Accelerator kinds other frameworks drive: named as unsupported rather than as unknown words."""
_GPU = re.compile(r"^(?:cuda|gpu)(?::(\d+))?$")


def parse_device_arg(device: Any, accepted: str, given: str | None = None) -> tuple[str, int | None] | None:
    """``("cpu", None)`` or ``("cuda", index)`` for the spellings every backend takes, else None.

    An int N means GPU N; ``'cpu'``, ``'cuda'``, ``'cuda:N'``, ``'gpu'`` and ``'gpu:N'`` are
    read in any case with spaces around (index None: the current GPU). A bool and a negative
    int are refused here, naming ``given`` (default ``device=<value>``) and ``accepted``; None
    is returned for anything else, which the backend checks (its device objects, its words).
    """
    given = f"device={device!r}" if given is None else given
    if isinstance(device, bool):
        raise DriverError(f"{given} is not a device; accepted: {accepted}.")
    if isinstance(device, int):
        if device < 0:
            raise DriverError(f"{given}: a GPU index must be >= 0; accepted: {accepted}.")
        return "cuda", device
    if isinstance(device, str):
        text = device.strip().lower()
        if text == "cpu":
            return "cpu", None
        match = _GPU.match(text)
        if match:
            return "cuda", None if match[1] is None else int(match[1])
    return None


def unaccepted_device(device: Any, accepted: str) -> DriverError:
    """The error for a ``device=`` of a type no backend reads (a float, a dict, ...)."""
    return DriverError(f"device={device!r} (a {type(device).__name__}) is not accepted; accepted: {accepted}.")


def unknown_device(device: Any, accepted: str, driver: str) -> DriverError:
    """The error for a ``device=`` :func:`parse_device_arg` did not read: another accelerator's kind (named as
    unsupported), a word ``driver`` does not understand, or an object of another type."""
    if not isinstance(device, str):
        return unaccepted_device(device, accepted)
    kind = device.strip().lower().split(":")[0]
    if kind in OTHER_DEVICE_KINDS:
        return DriverError(f"device={device!r} is a device kind ({kind!r}) the {driver} driver does not support; "
                           f"accepted: {accepted}.")
    return DriverError(f"device={device!r} is not a device the {driver} driver understands; accepted: {accepted}.")


def usable_cuda_index(given: Any, index: int | None, cuda: Any, unavailable: str) -> int:
    """The index of a CUDA ``device=given`` this process can use (the current device when ``index`` is None).

    ``cuda`` is the framework's CUDA module (``is_available()``, ``device_count()``,
    ``current_device()``: ``torch.cuda``, ``oneflow.cuda``); ``unavailable`` is the error's
    text when CUDA cannot be used at all. An absent index is refused by
    :func:`drivetrain.backend.checked_cuda_index`.
    """
    if not cuda.is_available():
        raise DriverError(unavailable)
    return checked_cuda_index(given, index, cuda.device_count(), cuda.current_device)


def first_tensor(model: Any) -> Any:
    """The model's first parameter, else its first buffer, else None: where ``device=None`` finds the model."""
    for tensor in model.parameters():
        return tensor
    for tensor in model.buffers():
        return tensor
    return None


def batch_mover(tensor_type: type, in_place: Callable[[Any], bool], to_device: Callable[[Any], Any],
                movable: Callable[[Any], bool] | None = None) -> Callable[[Any], Any]:
    """``move(batch)``: every tensor of a nested dict/list/tuple/namedtuple/dataclass batch on one device.

    ``in_place(tensor)`` says whether a tensor is already there; ``to_device(value)`` moves
    (or converts) the rest. ``movable(value)`` (default: an instance of ``tensor_type``)
    says what counts as a tensor, e.g. numeric numpy arrays too. The usual batch, a dict
    of ``tensor_type`` tensors already in place, is checked in one loop without recursion;
    anything else goes through :func:`move_nested`.
    """
    def is_tensor(value: Any) -> bool:
        return isinstance(value, tensor_type)

    def move(value: Any) -> Any:
        return value if isinstance(value, tensor_type) and in_place(value) else to_device(value)

    walk = is_tensor if movable is None else movable

    def move_batch(batch: Any) -> Any:
        if type(batch) is dict:  # the usual batch, tensors already there: checked without recursion
            for value in batch.values():
                if type(value) is not tensor_type or not in_place(value):
                    break
            else:
                return batch
        return move_nested(batch, walk, move)

    return move_batch


_ATOMS = (str, bytes, int, float, complex, bool, type(None), np.generic, np.ndarray)


def move_nested(batch: Any, is_tensor: Callable[[Any], bool], move: Callable[[Any], Any]) -> Any:
    """Apply ``move`` to every tensor inside a nested dict/list/tuple/namedtuple/dataclass.

    ``is_tensor(value)`` says what counts as a tensor (checked first, so a backend may
    treat numeric numpy arrays as tensors); ``move(tensor)`` returns the tensor where it
    belongs, and the very same object when it is already there. Anything else passes
    through unchanged. A container is rebuilt (same kind: mapping subclasses keep their
    class and extras, namedtuples their type, dataclasses are copied) only when something
    inside it changed, so a batch that is already in place costs one walk and no allocation.
    """
    if is_tensor(batch):
        return move(batch)
    if isinstance(batch, _ATOMS):
        return batch
    if isinstance(batch, Mapping):
        changed = {}
        for key, value in batch.items():
            moved = move_nested(value, is_tensor, move)
            if moved is not value:
                changed[key] = moved
        if not changed:
            return batch
        if isinstance(batch, MutableMapping) and type(batch) is not dict:
            out = copy.copy(batch)  # keeps the mapping's class and extras (defaultdict factory, ...)
            out.update(changed)
            return out
        return {key: changed.get(key, value) for key, value in batch.items()}
    if isinstance(batch, (list, tuple)):
        items = [move_nested(value, is_tensor, move) for value in batch]
        if all(new is old for new, old in zip(items, batch, strict=True)):
            return batch
        if isinstance(batch, tuple):
            if hasattr(batch, "_fields"):  # namedtuple
                return type(batch)(*items)
            return tuple(items) if type(batch) is tuple else type(batch)(items)
        return items if type(batch) is list else type(batch)(items)
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        changed = {}
        for field in dataclasses.fields(batch):
            value = getattr(batch, field.name)
            moved = move_nested(value, is_tensor, move)
            if moved is not value:
                changed[field.name] = moved
        if not changed:
            return batch
        new = copy.copy(batch)  # a new instance; works for frozen dataclasses and init=False fields
        for name, value in changed.items():
            object.__setattr__(new, name, value)
        return new
    return batch
