"""The numpy driver: the smallest complete implementation of the drivetrain Driver contract."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import safetensors.numpy

from drivetrain import Driver, DriverError, ReproducibleBatchSampler
from drivetrain.backend import array_buffer, check_lrs

from .data import ArrayLoader
from .model import LinearModel, NumpyLoss
from .optim import SGD


class NumpyDriver(Driver):
    name = "numpy"
    tensor_dataloader_example = "drivetrain_numpy.ArrayLoader({'x': x, 'target': y}, batch_size=32, shuffle=True)"

    def __init__(self, model: Any, **options: Any) -> None:
        if not isinstance(model, LinearModel):
            raise DriverError(f"model={type(model).__name__}: the numpy driver drives drivetrain_numpy.LinearModel only.")
        super().__init__(model, **options)

    def _check_optimizer(self, optimizer: Any) -> str | None:
        if not isinstance(optimizer, SGD):
            return "the numpy driver needs a drivetrain_numpy.SGD optimizer."
        if optimizer.params is not self.model.params:
            return "this optimizer does not optimise the model's parameters."
        return None

    def set_model_mode(self, mode: str) -> None:
        if mode not in ("train", "eval"):
            raise DriverError(f"mode={mode!r}; use 'train' or 'eval'.")
        self.model.training = mode == "train"

    def backward(self, loss: Any) -> None:
        if not isinstance(loss, NumpyLoss):
            raise DriverError(f"loss={loss!r} is not a NumpyLoss produced by the model.")
        loss.backward()

    def step(self) -> None:
        if self.grad_clip is not None:
            grads = self.model.grads
            if self.grad_clip_type == "value":
                for g in grads.values():
                    np.clip(g, -self.grad_clip, self.grad_clip, out=g)
            else:
                norm = self.grad_norm = float(np.sqrt(sum(float((g**2).sum()) for g in grads.values())))
                if norm > self.grad_clip:
                    for g in grads.values():
                        g *= self.grad_clip / (norm + 1e-6)
        for opt in self.optimizers:
            opt.step()

    def zero_grad(self) -> None:
        for opt in self.optimizers:
            opt.zero_grad()

    def get_lrs(self) -> list[list[float]]:
        return [[float(opt.lr)] for opt in self.optimizers]  # SGD has one param group: the whole model

    def set_lrs(self, lrs: list[list[float]]) -> None:
        for opt, (lr,) in zip(self.optimizers, check_lrs(lrs, [1] * len(self.optimizers)), strict=True):
            opt.lr = lr

    def set_dist_repro_dataloader(self, dataloader: Any, *, dist: str | None, reproducible: bool) -> Any:
        """An ArrayLoader gets a ReproducibleBatchSampler with the same batch size, shuffle and drop_last."""
        if not reproducible or not isinstance(dataloader, ArrayLoader) or dataloader.batch_sampler is not None:
            return dataloader
        sampler = ReproducibleBatchSampler(dataloader.n, dataloader.batch_size, shuffle=dataloader.shuffle,
                                           drop_last=dataloader.drop_last, seed=dataloader.seed)
        return ArrayLoader(dataloader.arrays, batch_size=dataloader.batch_size, batch_sampler=sampler)

    def move_data_to_device(self, batch: Any) -> Any:
        return batch

    def tensor_to_numpy(self, tensor: Any) -> np.ndarray:
        if isinstance(tensor, NumpyLoss):
            return np.asarray(tensor.value)
        return np.asarray(tensor)

    def is_tensor(self, obj: Any) -> bool:
        return isinstance(obj, (np.ndarray, NumpyLoss))

    def model_state(self) -> dict[str, Any]:
        return dict(self.model.params)  # the live arrays: a checkpoint writes them without a copy

    def load_model_state(self, state: Mapping[str, Any]) -> None:
        params = self.model.params
        if set(state) != set(params):
            raise DriverError(f"model state keys {sorted(state)} do not match the model's {sorted(params)}.")
        for k, v in state.items():
            params[k][...] = v

    def tensor_buffer(self, tensor: Any) -> tuple[str, tuple[int, ...], memoryview]:
        if not isinstance(tensor, np.ndarray):
            raise DriverError(f"is a {type(tensor).__name__}, not a numpy array.")
        return array_buffer(tensor)

    def tensors_from_bytes(self, data: bytes) -> dict[str, Any]:
        return safetensors.numpy.load(data)

    def seed(self, seed: int) -> None:
        np.random.seed(seed)

    def gradient_state(self) -> dict[str, Any]:
        return {k: v.copy() for k, v in self.model.grads.items() if np.any(v)}

    def load_gradient_state(self, grads: Mapping[str, Any]) -> None:
        for k, g in self.model.grads.items():
            g[...] = grads[k] if k in grads else 0.0

    def rng_state(self) -> dict[str, Any]:
        # numpy's global generator is this "framework's" generator (the core captures it too)
        kind, keys, pos, has_gauss, cached = np.random.get_state()
        return {"keys": keys.copy(), "pos": int(pos), "has_gauss": int(has_gauss), "cached": float(cached)}

    def load_rng_state(self, state: Mapping[str, Any]) -> None:
        if state:
            np.random.set_state(("MT19937", np.asarray(state["keys"], dtype=np.uint32), int(state["pos"]),
                                 int(state["has_gauss"]), float(state["cached"])))

    def framework_version(self) -> str:
        return np.__version__


def create_driver(model: Any, device: Any, *, framework_kwargs: Mapping | None = None, nproc: int | None = None,
                  **options: Any) -> NumpyDriver:
    if nproc not in (None, 1):
        raise DriverError(f"nproc={nproc!r}: the numpy driver runs in one process only.")
    if device not in (None, "cpu"):
        raise DriverError(f"device={device!r} is not accepted by the numpy driver; use 'cpu'.")
    if framework_kwargs:
        raise DriverError(f"numpy_kwargs={dict(framework_kwargs)!r}: the numpy driver takes no extra options.")
    return NumpyDriver(model, **options)
