"""Devices for the paddle backend: parse the user's ``device=`` once, and move batches there.

Everything that turns a user-supplied device into a paddle place lives here so the
rules (aliases, checks, messages) exist once. A device is kept as a :class:`Device`:
paddle's own string (``"cpu"``, ``"gpu:0"``) for ``paddle.set_device`` and
``Layer.to``, and the ``Place`` tensors are compared with.

:class:`Mover` walks a nested batch, moves paddle tensors that are elsewhere and turns
numeric numpy arrays into paddle tensors (a paddle layer cannot take a numpy array, and
a plain iterable of numpy batches is a common dataloader). The walk is the core's
:func:`drivetrain.backend.batch_mover`: a batch already in place costs one walk.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import paddle

from drivetrain.backend import (
    DriverError,
    batch_mover,
    checked_cuda_index,
    first_tensor,
    parse_device_arg,
    unknown_device,
)

from .plugin import TESTED_PADDLE

ACCEPTED = (
    "'cpu', 'gpu', 'gpu:N', 'cuda', 'cuda:N', an int N (meaning gpu:N), a paddle.CPUPlace / paddle.CUDAPlace, "
    "or None (keep the model on the device it is on)"
)


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
    tensor = first_tensor(model)
    if tensor is None or tensor.place.is_cpu_place():
        return Device("cpu")
    if tensor.place.is_gpu_place():
        return Device("gpu", tensor.place.gpu_device_id())
    raise DriverError(f"device=None keeps the model where it is, but the model is on {tensor.place}; the paddle "
                      "driver supports the CPU and CUDA GPUs. Pass device='cpu' or device='gpu'.")


def resolve_device(device: Any, model: paddle.nn.Layer) -> Device:
    """Turn the user's ``device=`` into a checked :class:`Device` with an explicit GPU index."""
    if device is None:
        resolved = model_device(model)
    elif isinstance(device, Device):  # a distributed plan's, checked when planned
        return device
    elif isinstance(device, paddle.CPUPlace):
        resolved = Device("cpu")
    elif isinstance(device, paddle.CUDAPlace):
        resolved = Device("gpu", device.gpu_device_id())
    else:
        parsed = parse_device_arg(device, ACCEPTED)
        if parsed is None:
            raise unknown_device(device, ACCEPTED, "paddle")
        resolved = Device("cpu") if parsed[0] == "cpu" else Device("gpu", parsed[1])
    if resolved.kind == "gpu":
        resolved = _check_gpu(device, resolved)
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
        raise DriverError(f"device={given!r} asks for a GPU but paddle sees none (CUDA build, 0 devices visible to "
                          "this process); check CUDA_VISIBLE_DEVICES and the driver, or use device='cpu'.")
    return Device("gpu", checked_cuda_index(given, device.index, count, lambda: 0, spelling="gpu", noun="GPU(s)"))


def _movable(value: Any) -> bool:
    """What a batch mover moves: paddle tensors and numeric numpy arrays."""
    return isinstance(value, paddle.Tensor) or (type(value) is np.ndarray and value.dtype.kind in "biufc")


def _cpu_only_build() -> bool:
    """Whether this paddle has no device but the CPU (no CUDA, XPU or plugged-in device): then every tensor
    is a CPU tensor, and asking each batch tensor for its place (a new Place object each time) is wasted."""
    return not (paddle.is_compiled_with_cuda() or paddle.is_compiled_with_xpu()
                or paddle.device.get_all_custom_device_type())


class Mover:
    """Moves nested batches to one device (one instance per driver; the checks are bound once).

    Every paddle tensor of a nested dict/list/tuple/namedtuple/dataclass goes to the device
    and numeric numpy arrays become paddle tensors there; everything else is returned
    unchanged, and a container is rebuilt only when something inside it changed.
    """

    def __init__(self, device: Device) -> None:
        self.index, self.place, self.on_cpu = device.index, device.place(), device.kind == "cpu"
        in_place = (lambda tensor: True) if self.on_cpu and _cpu_only_build() else self.in_place
        self.move = batch_mover(paddle.Tensor, in_place, self.to_device, _movable)  # moves one batch

    def in_place(self, tensor: paddle.Tensor) -> bool:
        place = tensor.place
        return place.is_cpu_place() if self.on_cpu else place.is_gpu_place() and place.gpu_device_id() == self.index

    def to_device(self, value: Any) -> Any:
        """A paddle tensor moved to the device, or a numeric numpy array converted there."""
        if not isinstance(value, paddle.Tensor):
            return paddle.to_tensor(value, place=self.place)
        return value.cpu() if self.on_cpu else value.cuda(self.index, blocking=False)
