"""The single-process torch driver (:mod:`.factory` builds it, or the distributed one).

Every argument (device, model, precision, framework options) is validated up front, by
the factory and the constructor, so a wrong input fails when the Trainer is built, not
in the middle of the first epoch. The per-batch methods (``move_data_to_device``,
``auto_cast``, ``backward``, ``step``, ``zero_grad``) do as little as possible.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from drivetrain.backend import (
    Driver,
    DriverError,
    bool_option,
    check_framework_kwargs,
    check_lrs,
    check_model_type,
)

from . import _rng
from . import state as _state
from ._dataloader import reproducible_dataloader, reseed_for_epoch
from ._device import move_to_device, resolve_device
from .plugin import CAPABILITIES
from .precision import Precision

FRAMEWORK_KWARGS = {
    "grad_scaler_kwargs": "dict passed to torch.amp.GradScaler for precision='fp16' "
    "(init_scale, growth_factor, backoff_factor, growth_interval, enabled)",
    "non_blocking": "bool: copy batches to a GPU asynchronously (default True on CUDA; pin_memory=True "
    "in the DataLoader makes it effective)",
    "set_to_none": "bool: zero_grad sets gradients to None instead of filling zeros (default True)",
}
_DISTRIBUTED_ONLY_KWARGS = ("ddp_kwargs", "timeout", "backend", "even_batches", "spawn_output")

_LOW_PRECISION_FLOATS = (torch.float16, torch.bfloat16)


def check_model(model: Any) -> None:
    """The torch drivers drive ``torch.nn.Module`` instances (a DistributedDataParallel is one)."""
    check_model_type(model, torch.nn.Module, driver="torch", expected="torch.nn.Module")


def _check_framework_kwargs(framework_kwargs: Any, accepted: Mapping[str, str]) -> dict[str, Any]:
    single_only = {
        key: "applies to distributed torch training, but this run is a single process; remove it, or train "
        "distributed: device=[0, 1], nproc=N, or start the script with torchrun."
        for key in _DISTRIBUTED_ONLY_KWARGS if key not in accepted
    }
    return check_framework_kwargs(framework_kwargs, accepted, argument="torch_kwargs", not_here=single_only)


class TorchSingleDriver(Driver):
    """Drives a ``torch.nn.Module`` in one process on one device (CPU or one CUDA GPU)."""

    name = "torch"
    capabilities = CAPABILITIES
    default_forward_name = "forward"
    accepted_kwargs: Mapping[str, str] = FRAMEWORK_KWARGS
    """The ``torch_kwargs`` keys this driver understands, with what each means."""

    def __init__(
        self,
        model: Any,
        device: Any,
        *,
        precision: str = "fp32",
        grad_clip: float | None = None,
        grad_clip_type: str = "norm",
        model_wo_auto_param_call: bool = False,
        framework_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        check_model(model)
        super().__init__(
            model,
            precision=precision,
            grad_clip=grad_clip,
            grad_clip_type=grad_clip_type,
            model_wo_auto_param_call=model_wo_auto_param_call,
        )
        options = _check_framework_kwargs(framework_kwargs, self.accepted_kwargs)
        self.device: torch.device = resolve_device(device, model)
        self.non_blocking = bool_option(options, "non_blocking", self.device.type == "cuda", argument="torch_kwargs")
        self.set_to_none = bool_option(options, "set_to_none", True, argument="torch_kwargs")
        self._precision = Precision(precision, self.device, options.get("grad_scaler_kwargs"))
        self.grad_scaler = self._precision.scaler

    # ------------------------------------------------------------------ lifecycle
    def setup(self) -> None:
        """Move the model to the driver's device (parameters keep their identity, so optimizers stay valid)."""
        self.model.to(self.device)

    # ---------------------------------------------------------------------- model
    def unwrap_model(self) -> torch.nn.Module:
        """The user's module, looking through ``torch.compile`` wrappers."""
        model = self.model
        while isinstance(getattr(model, "_orig_mod", None), torch.nn.Module):
            model = model._orig_mod
        return model

    def _wrapped_model_call(self) -> Any:
        return self.model  # calling the module runs its hooks; parameters are read from forward

    def set_model_mode(self, mode: str) -> None:
        if mode == "train":
            self.model.train()
        elif mode == "eval":
            self.model.eval()
        else:
            raise DriverError(f"set_model_mode(mode={mode!r}) accepts 'train' or 'eval'.")

    def no_grad(self) -> contextlib.AbstractContextManager:
        return torch.no_grad()

    def auto_cast(self) -> contextlib.AbstractContextManager:
        return self._precision.autocast()

    # --------------------------------------------------------------- optimisation
    def _check_optimizer(self, optimizer: Any) -> str | None:
        if isinstance(optimizer, type):
            return (
                "is a class, not an optimizer; create one from the model's parameters, "
                "e.g. torch.optim.SGD(model.parameters(), lr=0.1)."
            )
        if not isinstance(optimizer, torch.optim.Optimizer):
            framework = (type(optimizer).__module__ or "").split(".")[0]
            origin = (
                f" (a {framework} object)" if framework and framework not in ("builtins", "torch") else ""
            )
            return (
                f"is not a torch.optim.Optimizer{origin}; the torch driver needs a torch optimizer, "
                "e.g. torch.optim.AdamW(model.parameters(), lr=1e-3)."
            )
        own = {id(p) for p in self.unwrap_model().parameters()}
        params = [p for group in optimizer.param_groups for p in group["params"]]
        if params and not any(id(p) in own for p in params):
            return (
                f"none of its {len(params)} parameter(s) belong to the model {type(self.unwrap_model()).__name__}, "
                "so stepping it would never change the model. Was it built from another model instance "
                "(e.g. before the model was re-created or deep-copied)? Build it from this model's "
                "parameters, and register any extra trainable tensors on the model."
            )
        return None

    def backward(self, loss: Any) -> None:
        if not isinstance(loss, torch.Tensor) or not loss.requires_grad:
            self._raise_bad_loss(loss)
        try:
            if self.grad_scaler is not None:
                self.grad_scaler.scale(loss).backward()
            else:
                loss.backward()
        except RuntimeError as exc:
            if loss.numel() != 1:
                raise DriverError(
                    f"the model's output 'loss' has shape {tuple(loss.shape)}; backward needs a single number: "
                    "reduce it in the model, e.g. loss.mean()."
                ) from exc
            raise
        # Keep the last loss (and so its graph, whose saved tensors backward has already freed)
        # until the next backward, as a hand-written loop's `loss` variable does: the graph holds
        # the parameters' AccumulateGrad nodes, which the next forward then reuses instead of
        # rebuilding them (~6k instructions per step for 2 parameters, GIL round trips included).
        self._last_loss = loss

    @staticmethod
    def _raise_bad_loss(loss: Any) -> None:
        if not isinstance(loss, torch.Tensor):
            raise DriverError(
                f"the model's output 'loss' is a {type(loss).__name__} ({loss!r:.60}), not a torch tensor; "
                "return the loss tensor itself (do not call .item() or float() on it)."
            )
        raise DriverError(
            "the model's output 'loss' does not require grad: did you compute it under no_grad or detach it? "
            "(Also check that the model has trainable parameters, i.e. requires_grad=True.)"
        )

    def _clip_gradients(self) -> None:
        params = [p for opt in self.optimizers for group in opt.param_groups for p in group["params"]]
        if self.grad_clip_type == "norm":
            torch.nn.utils.clip_grad_norm_(params, self.grad_clip)
        else:
            torch.nn.utils.clip_grad_value_(params, self.grad_clip)

    def step(self) -> None:
        scaler = self.grad_scaler
        if scaler is None:
            if self.grad_clip is not None:
                self._clip_gradients()
            for optimizer in self.optimizers:
                optimizer.step()
            return
        if self.grad_clip is not None:
            for optimizer in self.optimizers:
                scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
            self._clip_gradients()
        for optimizer in self.optimizers:
            scaler.step(optimizer)
        scaler.update()

    def zero_grad(self) -> None:
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=self.set_to_none)

    def get_lrs(self) -> list[list[float]]:
        return [[float(group["lr"]) for group in optimizer.param_groups] for optimizer in self.optimizers]

    def set_lrs(self, lrs: list[list[float]]) -> None:
        checked = check_lrs(lrs, [len(optimizer.param_groups) for optimizer in self.optimizers])
        for optimizer, rates in zip(self.optimizers, checked, strict=True):
            for group, lr in zip(optimizer.param_groups, rates, strict=True):
                if isinstance(group["lr"], torch.Tensor):  # a tensor rate (capturable / fused optimizers): in place
                    group["lr"].fill_(lr)
                else:
                    group["lr"] = lr

    # ----------------------------------------------------------------------- data
    def move_data_to_device(self, batch: Any) -> Any:
        return move_to_device(batch, self.device, self.non_blocking)

    def tensor_to_numpy(self, tensor: Any) -> np.ndarray:
        if not isinstance(tensor, torch.Tensor):
            return np.asarray(tensor)
        copied = tensor.device.type != "cpu"
        if tensor.dtype in _LOW_PRECISION_FLOATS or (
            tensor.is_floating_point() and tensor.element_size() == 1
        ):
            tensor = tensor.detach().float()  # numpy has no bfloat16 / float8
            copied = True
        array = tensor.numpy(force=True)
        return array if copied else array.copy()

    def is_tensor(self, obj: Any) -> bool:
        return isinstance(obj, torch.Tensor)

    def check_dataloader_legality(self, dataloader: Any, argument: str = "train_dataloader") -> None:
        if isinstance(dataloader, torch.utils.data.DataLoader):
            return
        if isinstance(dataloader, torch.utils.data.Dataset) and not hasattr(dataloader, "__iter__"):
            raise DriverError(
                f"{argument}={type(dataloader).__name__} is a Dataset, not a dataloader; wrap it, e.g. "
                f"torch.utils.data.DataLoader(dataset, batch_size=32, shuffle=True)."
            )
        super().check_dataloader_legality(dataloader, argument)

    def set_dist_repro_dataloader(self, dataloader: Any, *, dist: str | None, reproducible: bool) -> Any:
        """A DataLoader that resumes sample-exactly when ``reproducible`` (see :mod:`._dataloader`).

        Sharding (``dist="train"``/``"eval"``) belongs to the distributed torch driver
        (:mod:`.distributed`); this single-process driver is never asked for it and
        returns ``dataloader`` as is.
        """
        if dist not in (None, "train", "eval"):
            raise DriverError(f"set_dist_repro_dataloader(dist={dist!r}): use None, 'train' or 'eval'.")
        if dist is not None or not reproducible:
            return dataloader
        return reproducible_dataloader(dataloader)

    def set_sampler_epoch(self, dataloader: Any, epoch: int) -> None:
        super().set_sampler_epoch(dataloader, epoch)
        reseed_for_epoch(dataloader, epoch)

    # ---------------------------------------------------------------------- state
    def model_state(self) -> dict[str, Any]:
        return _state.model_state(self.unwrap_model())

    def load_model_state(self, state: Mapping[str, Any]) -> None:
        _state.load_model_state(self.unwrap_model(), state)

    def tensor_buffer(self, tensor: Any) -> tuple[str, tuple[int, ...], memoryview]:
        return _state.tensor_buffer(tensor)

    def tensors_from_bytes(self, data: bytes) -> dict[str, Any]:
        return _state.tensors_from_bytes(data)

    def seed(self, seed: int) -> None:
        torch.manual_seed(seed)  # seeds every CUDA device too (lazily if CUDA is not initialised yet)
        if torch.cuda.is_available():
            torch.cuda.manual_seed_all(seed)

    # ------------------------------------------------- training state (checkpoints)
    def _load_optimizer_state(self, optimizer: Any, state: Any, where: str) -> None:
        """Load ``state`` after restoring its int parameter keys (see :func:`.state.optimizer_state_for_load`)."""
        prepared = _state.optimizer_state_for_load(state, where)
        try:
            optimizer.load_state_dict(prepared)
        except ValueError as exc:  # torch: different number or sizes of param groups
            raise DriverError(
                f"load_optimizer_states: {exc}; build the optimizers over the same parameters, in the same "
                "groups, as the run that saved the checkpoint."
            ) from exc

    def gradient_state(self) -> dict[str, Any]:
        return _state.gradient_state(self.unwrap_model())

    def load_gradient_state(self, grads: Mapping[str, Any]) -> None:
        _state.load_gradient_state(self.unwrap_model(), grads)

    def precision_state(self) -> Any:
        return self._precision.state()

    def load_precision_state(self, state: Any) -> None:
        self._precision.load_state(state)

    def rng_state(self) -> dict[str, Any]:
        return _rng.rng_state()

    def load_rng_state(self, state: Mapping[str, Any]) -> None:
        _rng.load_rng_state(state)

    def framework_version(self) -> str:
        return str(torch.__version__)

    # ----------------------------------------------------------------- describing
    def describe(self) -> str:
        return f"torch driver (TorchSingleDriver) device={self.device} precision={self.precision} torch={torch.__version__}"
