"""Devices for the paddle backend: parse the user's ``device=`` once, and move batches there.

Everything that turns a user-supplied device into a paddle place lives here so the
rules (aliases, checks, messages) exist once. A device is kept as a :class:`Device`:
paddle's own string (``"cpu"``, ``"gpu:0"``) for ``paddle.set_device`` and
``Layer.to``, and the ``Place`` tensors are compared with.

:func:`move_to_device` walks a nested batch, moves paddle tensors that are elsewhere
and turns numeric numpy arrays into paddle tensors (a paddle layer cannot take a numpy
array, and a plain iterable of numpy batches is a common dataloader). The walk is the
core's :func:`drivetrain.backend.move_nested`: a batch already in place costs one walk.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import numpy as np
import paddle

from drivetrain.backend import DriverError, move_nested

from .plugin import TESTED_PADDLE

ACCEPTED = (
    "'cpu', 'gpu', 'gpu:N', 'cuda', 'cuda:N', an int N (meaning gpu:N), a paddle.CPUPlace / paddle.CUDAPlace, "
    "or None (keep the model on the device it is on)"
)
_GPU = re.compile(r"^(?:gpu|cuda)(?::(\d+))?$")


@dataclasses.dataclass(frozen=True)
class Device:
    """A checked device: ``kind`` is ``"cpu"`` or ``"gpu"``; ``index`` the GPU number (None on CPU)."""

    kind: str
    index: int | None = None

    @property
    def name(self) -> str:
        """paddle's spelling, for ``paddle.set_device`` and ``Layer.to``."""
        return "cpu" if self.kind == "cpu" else f"gpu:{self.index}"

    def place(self) -> Any:
        return paddle.CPUPlace() if self.kind == "cpu" else paddle.CUDAPlace(self.index)

    def __str__(self) -> str:
        return self.name


def model_device(model: paddle.nn.Layer) -> Device:
    """The device of the model's first parameter or buffer; the CPU for a model without any."""
    for tensor in model.parameters():
        return _device_of(tensor)
    for tensor in model.buffers():
        return _device_of(tensor)
    return Device("cpu")


def _device_of(tensor: paddle.Tensor) -> Device:
    place = tensor.place
    if place.is_gpu_place():
        return Device("gpu", place.gpu_device_id())
    if place.is_cpu_place():
        return Device("cpu")
    raise DriverError(
        f"device=None keeps the model where it is, but the model is on {place}; the paddle driver supports "
        "the CPU and CUDA GPUs. Pass device='cpu' or device='gpu'."
    )


def resolve_device(device: Any, model: paddle.nn.Layer) -> Device:
    """Turn the user's ``device=`` into a checked :class:`Device` with an explicit GPU index."""
    given = device
    if device is None:
        resolved = model_device(model)
    elif isinstance(device, bool):
        raise DriverError(f"device={given!r} is not a device; accepted: {ACCEPTED}.")
    elif isinstance(device, int):
        if device < 0:
            raise DriverError(f"device={given!r}: a GPU index must be >= 0; accepted: {ACCEPTED}.")
        resolved = Device("gpu", device)
    elif isinstance(device, str):
        text = device.strip().lower()
        match = _GPU.match(text)
        if text == "cpu":
            resolved = Device("cpu")
        elif match:
            resolved = Device("gpu", None if match[1] is None else int(match[1]))
        else:
            kind = text.split(":")[0]
            known = kind in ("xpu", "npu", "mlu", "ipu", "mps", "tpu", "xla")
            raise DriverError(
                f"device={given!r} "
                + (f"is a device kind ({kind!r}) the paddle driver does not support" if known
                   else "is not a device the paddle driver understands")
                + f"; accepted: {ACCEPTED}."
            )
    elif isinstance(device, paddle.CPUPlace):
        resolved = Device("cpu")
    elif isinstance(device, paddle.CUDAPlace):
        resolved = Device("gpu", device.gpu_device_id())
    else:
        raise DriverError(f"device={given!r} (a {type(given).__name__}) is not accepted; accepted: {ACCEPTED}.")
    if resolved.kind == "gpu":
        resolved = _check_gpu(given, resolved)
    return resolved


def _check_gpu(given: Any, device: Device) -> Device:
    if not paddle.is_compiled_with_cuda():
        raise DriverError(
            f"device={given!r} asks for a GPU but this paddle build has no CUDA (paddle {paddle.__version__}, "
            "paddle.is_compiled_with_cuda() is False); use device='cpu', or install the GPU build on a machine "
            f"with a GPU: pip install paddlepaddle-gpu=={TESTED_PADDLE} (in place of paddlepaddle)."
        )
    count = paddle.device.cuda.device_count()
    if count == 0:
        raise DriverError(
            f"device={given!r} asks for a GPU but paddle sees none (CUDA build, 0 devices visible to this "
            "process); check CUDA_VISIBLE_DEVICES and the driver, or use device='cpu'."
        )
    index = 0 if device.index is None else device.index
    if index >= count:
        raise DriverError(
            f"device={given!r}: gpu:{index} does not exist, this process sees {count} GPU(s) "
            f"(valid: {', '.join(f'gpu:{i}' for i in range(count))}). Check CUDA_VISIBLE_DEVICES."
        )
    return Device("gpu", index)


def _is_numeric_array(value: Any) -> bool:
    return type(value) is np.ndarray and value.dtype.kind in "biufc"


class Mover:
    """Moves nested batches to one device (one instance per driver; the checks are bound once)."""

    def __init__(self, device: Device) -> None:
        self.device = device
        self.place = device.place()
        self.on_cpu = device.kind == "cpu"

    def in_place(self, tensor: paddle.Tensor) -> bool:
        place = tensor.place
        if self.on_cpu:
            return place.is_cpu_place()
        return place.is_gpu_place() and place.gpu_device_id() == self.device.index

    def tensor(self, value: Any) -> Any:
        """``value`` on the device: a paddle tensor moved if needed, a numeric numpy array converted."""
        if isinstance(value, paddle.Tensor):
            if self.in_place(value):
                return value
            return value.cpu() if self.on_cpu else value.cuda(self.device.index, blocking=False)
        return paddle.to_tensor(value, place=self.place)

    def __call__(self, batch: Any) -> Any:
        """Move every tensor (and numeric numpy array) in a nested dict/list/tuple/namedtuple/dataclass.

        Everything else is returned unchanged; a container is rebuilt (as a new object of
        the same kind) only when something inside it changed.
        """
        if type(batch) is dict:  # the usual batch, a dict of tensors already there: checked without recursion
            for value in batch.values():
                if type(value) is not paddle.Tensor or not self.in_place(value):
                    break
            else:
                return batch
        return move_nested(batch, self.is_tensor, self.tensor)

    @staticmethod
    def is_tensor(value: Any) -> bool:
        """What the mover moves: paddle tensors and numeric numpy arrays."""
        return isinstance(value, paddle.Tensor) or _is_numeric_array(value)
