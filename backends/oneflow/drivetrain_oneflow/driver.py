"""The single-process oneflow driver (:mod:`.factory` builds it, or the distributed one).

Importing this module first checks that this Python and this oneflow can work at all
(:mod:`._compat`, before oneflow is imported); the factory and the constructor then
validate every argument (device, model, precision, ``oneflow_kwargs``) so a wrong input
fails when the Trainer is built.
A CUDA device is checked for availability before anything is moved: oneflow 0.9
aborts the process on a ``.to("cuda")`` it cannot honour.
"""

from __future__ import annotations

from ._compat import runtime_problem

_problem = runtime_problem()
if _problem is not None:  # before importing oneflow: on Python 3.11 that import fails obscurely
    from drivetrain.backend import DriverError

    raise DriverError(_problem)

import contextlib  # noqa: E402
from collections.abc import Mapping  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import oneflow as flow  # noqa: E402

from drivetrain.backend import NULL_CONTEXT, ModuleDriver  # noqa: E402

from . import _dataloader, _rng  # noqa: E402
from . import state as _state  # noqa: E402
from ._device import batch_mover, resolve_device  # noqa: E402
from .plugin import CAPABILITIES  # noqa: E402
from .precision import SCALER_KWARGS, Precision  # noqa: E402

FRAMEWORK_KWARGS = {
    "grad_scaler_kwargs": "dict for the fp16 loss scaler on CUDA (" + ", ".join(SCALER_KWARGS) + ")",
}
_DISTRIBUTED_ONLY_KWARGS = ("ddp_kwargs", "timeout", "even_batches", "spawn_output")


class OneflowSingleDriver(ModuleDriver, torch_style="oneflow"):
    """Drives a ``oneflow.nn.Module`` in one process on one device (CPU or one CUDA GPU)."""

    name = "oneflow"
    capabilities = CAPABILITIES
    framework = flow
    optimizer_example = "oneflow.optim.Adam(model.parameters(), lr=1e-3)"
    accepted_kwargs: Mapping[str, str] = FRAMEWORK_KWARGS
    """The ``oneflow_kwargs`` keys this driver understands, with what each means."""
    distributed_only_kwargs = _DISTRIBUTED_ONLY_KWARGS
    distributed_hint = ("train distributed: nproc=N, device=[0, 1], or python -m oneflow.distributed.launch "
                        "--nproc_per_node N train.py")
    state_ops = _state
    data_ops = _dataloader
    optimizer_load_errors = (ValueError, KeyError)

    def resolve_device(self, device: Any, model: Any) -> flow.device:
        return resolve_device(device, model)

    def configure(self, options: dict[str, Any]) -> None:
        self._precision = Precision(self.precision, self.device, options.get("grad_scaler_kwargs"))
        self._move = batch_mover(self.device)
        self._null_cast = None if self._precision.active else NULL_CONTEXT
        self.loss_scaler = self._precision.scaler
        _rng.give_modules_device_generators(self.model, self.device.type)  # so that their states can be saved

    # ---------------------------------------------------------------------- model
    def auto_cast(self) -> contextlib.AbstractContextManager:
        return self._null_cast or self._precision.autocast()

    # --------------------------------------------------------------- optimisation
    def optimizer_params(self, optimizer: Any) -> list[Any]:
        return [p for group in optimizer.param_groups for p in group.parameters]  # a ParamGroup, not a dict

    def backward(self, loss: Any) -> None:
        """The template's checks and backward in one call: this runs every step."""
        if not isinstance(loss, flow.Tensor) or not loss.requires_grad:
            self.raise_bad_loss(loss)
        if loss.numel() != 1:  # oneflow would fail obscurely on a non-scalar loss
            raise self.multi_value_error(loss)
        scaler = self.loss_scaler
        (loss if scaler is None else scaler.scale_loss(loss)).backward()

    def clip_gradients(self, params: list[Any]) -> Any:
        params = [p for p in params if p.grad is not None]  # oneflow's clipping fails on a None gradient
        return super().clip_gradients(params) if params else None

    def step(self) -> None:
        scaler = self.loss_scaler
        if scaler is None:
            super().step()
            return
        if self.grad_clip is not None and scaler.unscale(self.trainable_params()):
            self.grad_norm = self.clip_gradients(self.trainable_params())  # the true gradients, not the scaled
        scaler.step(self.optimizers, self.trainable_params)

    def zero_grad(self) -> None:
        # Gradients are zeroed in place (oneflow's default), never set to None: under DDP they
        # live in the all-reduce buckets, and a None gradient would be re-created over stale values.
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=False)

    # ----------------------------------------------------------------------- data
    def move_data_to_device(self, batch: Any) -> Any:
        return self._move(batch)

    def tensor_to_numpy(self, tensor: Any) -> np.ndarray:
        if not isinstance(tensor, flow.Tensor):
            return np.asarray(tensor)
        tensor = tensor.detach()
        copied = tensor.device.type != "cpu"
        if tensor.dtype in (flow.float16, flow.bfloat16):
            tensor = tensor.to(flow.float32)  # numpy has no bfloat16; metrics want float32
            copied = True
        array = tensor.numpy()
        return array if copied else array.copy()

    # ---------------------------------------------------------------------- state
    def seed(self, seed: int) -> None:
        """Seed oneflow's default generators and every module-owned one (Dropout's), see :mod:`._rng`."""
        _rng.seed_all(self.unwrap_model(), seed)

    def rng_state(self) -> dict[str, Any]:
        return _rng.rng_state(self.unwrap_model())

    def load_rng_state(self, state: Mapping[str, Any]) -> None:
        _rng.load_rng_state(state, self.unwrap_model())
