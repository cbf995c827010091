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

from drivetrain.backend import Driver, DriverError, check_framework_kwargs, check_lrs, check_model_type  # noqa: E402

from . import _rng  # noqa: E402
from . import state as _state  # noqa: E402
from ._dataloader import reproducible_dataloader, reseed_for_epoch  # noqa: E402
from ._device import batch_mover, is_tensor, resolve_device  # noqa: E402
from .plugin import CAPABILITIES  # noqa: E402
from .precision import SCALER_KWARGS, Precision  # noqa: E402

FRAMEWORK_KWARGS = {
    "grad_scaler_kwargs": "dict for the fp16 loss scaler on CUDA (" + ", ".join(SCALER_KWARGS) + ")",
}
_DISTRIBUTED_ONLY_KWARGS = ("ddp_kwargs", "timeout", "even_batches", "spawn_output")


def check_model(model: Any) -> None:
    """The oneflow drivers drive ``oneflow.nn.Module`` instances."""
    check_model_type(model, flow.nn.Module, driver="oneflow", expected="oneflow.nn.Module")


def _check_framework_kwargs(framework_kwargs: Any, accepted: Mapping[str, str]) -> dict[str, Any]:
    single_only = {
        key: "applies to distributed oneflow training, but this run is a single process; remove it, or train "
        "distributed: nproc=N, device=[0, 1], or python -m oneflow.distributed.launch --nproc_per_node N train.py."
        for key in _DISTRIBUTED_ONLY_KWARGS if key not in accepted
    }
    return check_framework_kwargs(framework_kwargs, accepted, argument="oneflow_kwargs", not_here=single_only)


class OneflowSingleDriver(Driver):
    """Drives a ``oneflow.nn.Module`` in one process on one device (CPU or one CUDA GPU)."""

    name = "oneflow"
    capabilities = CAPABILITIES
    default_forward_name = "forward"
    accepted_kwargs: Mapping[str, str] = FRAMEWORK_KWARGS
    """The ``oneflow_kwargs`` keys this driver understands, with what each means."""

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
        super().__init__(model, precision=precision, grad_clip=grad_clip, grad_clip_type=grad_clip_type,
                         model_wo_auto_param_call=model_wo_auto_param_call)
        options = _check_framework_kwargs(framework_kwargs, self.accepted_kwargs)
        self.device: flow.device = resolve_device(device, model)
        self._precision = Precision(precision, self.device, options.get("grad_scaler_kwargs"))
        self._move = batch_mover(self.device)
        self._null_cast = None if self._precision.active else contextlib.nullcontext()  # one shared no-op
        self.loss_scaler = self._precision.scaler
        _rng.give_modules_device_generators(model, self.device.type)  # so that their states can be saved

    # ------------------------------------------------------------------ lifecycle
    def setup(self) -> None:
        """Move the model to the driver's device (parameters keep their identity, so optimizers stay valid)."""
        self.model.to(self.device)

    # ---------------------------------------------------------------------- model
    def set_model_mode(self, mode: str) -> None:
        if mode == "train":
            self.model.train()
        elif mode == "eval":
            self.model.eval()
        else:
            raise DriverError(f"set_model_mode(mode={mode!r}) accepts 'train' or 'eval'.")

    def no_grad(self) -> contextlib.AbstractContextManager:
        return flow.no_grad()

    def auto_cast(self) -> contextlib.AbstractContextManager:
        return self._null_cast or self._precision.autocast()

    # --------------------------------------------------------------- optimisation
    def _check_optimizer(self, optimizer: Any) -> str | None:
        if isinstance(optimizer, type):
            return ("is a class, not an optimizer; create one from the model's parameters, "
                    "e.g. oneflow.optim.SGD(model.parameters(), lr=0.1).")
        if not isinstance(optimizer, flow.optim.Optimizer):
            framework = (type(optimizer).__module__ or "").split(".")[0]
            origin = f" (a {framework} object)" if framework and framework not in ("builtins", "oneflow") else ""
            return (f"is not a oneflow.optim.Optimizer{origin}; the oneflow driver needs a oneflow optimizer, "
                    "e.g. oneflow.optim.Adam(model.parameters(), lr=1e-3).")
        own = {id(p) for p in self.unwrap_model().parameters()}
        params = list(self._optimizer_params(optimizer))
        if params and not any(id(p) in own for p in params):
            return (f"none of its {len(params)} parameter(s) belong to the model {type(self.unwrap_model()).__name__}, "
                    "so stepping it would never change the model. Build it from this model's parameters.")
        return None

    @staticmethod
    def _optimizer_params(optimizer: Any) -> list[Any]:
        return [p for group in optimizer.param_groups for p in group.parameters]

    def _all_params(self) -> list[Any]:
        return [p for opt in self.optimizers for p in self._optimizer_params(opt)]

    def backward(self, loss: Any) -> None:
        if not isinstance(loss, flow.Tensor) or not loss.requires_grad:
            self._raise_bad_loss(loss)
        if loss.numel() != 1:
            raise DriverError(
                f"the model's output 'loss' has shape {tuple(loss.shape)}; backward needs a single number: "
                "reduce it in the model, e.g. loss.mean()."
            )
        if self.loss_scaler is not None:
            loss = self.loss_scaler.scale_loss(loss)
        loss.backward()

    @staticmethod
    def _raise_bad_loss(loss: Any) -> None:
        if not isinstance(loss, flow.Tensor):
            raise DriverError(
                f"the model's output 'loss' is a {type(loss).__name__} ({loss!r:.60}), not a oneflow tensor; "
                "return the loss tensor itself (do not call .item() or float() on it)."
            )
        raise DriverError(
            "the model's output 'loss' does not require grad: did you compute it under no_grad or detach it? "
            "(Also check that the model has trainable parameters, i.e. requires_grad=True.)"
        )

    def _clip_gradients(self) -> None:
        params = [p for p in self._all_params() if p.grad is not None]
        if not params:
            return
        if self.grad_clip_type == "norm":
            flow.nn.utils.clip_grad_norm_(params, self.grad_clip)
        else:
            flow.nn.utils.clip_grad_value_(params, self.grad_clip)

    def step(self) -> None:
        scaler = self.loss_scaler
        if scaler is None:
            if self.grad_clip is not None:
                self._clip_gradients()
            for optimizer in self.optimizers:
                optimizer.step()
            return
        if self.grad_clip is not None and scaler.unscale(self._all_params()):
            self._clip_gradients()  # clip the true gradients, not the scaled ones
        scaler.step(self.optimizers, self._all_params)

    def get_lrs(self) -> list[list[float]]:
        return [[float(group["lr"]) for group in optimizer.param_groups] for optimizer in self.optimizers]

    def set_lrs(self, lrs: list[list[float]]) -> None:
        checked = check_lrs(lrs, [len(optimizer.param_groups) for optimizer in self.optimizers])
        for optimizer, rates in zip(self.optimizers, checked, strict=True):
            for group, lr in zip(optimizer.param_groups, rates, strict=True):
                group["lr"] = lr  # a ParamGroup's options, read by every step (as oneflow's own schedulers write it)

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

    def is_tensor(self, obj: Any) -> bool:
        return is_tensor(obj)

    def check_dataloader_legality(self, dataloader: Any, argument: str = "train_dataloader") -> None:
        if isinstance(dataloader, flow.utils.data.DataLoader):
            return
        if isinstance(dataloader, flow.utils.data.Dataset) and not hasattr(dataloader, "__iter__"):
            raise DriverError(
                f"{argument}={type(dataloader).__name__} is a Dataset, not a dataloader; wrap it, e.g. "
                "oneflow.utils.data.DataLoader(dataset, batch_size=32, shuffle=True)."
            )
        super().check_dataloader_legality(dataloader, argument)

    def set_dist_repro_dataloader(self, dataloader: Any, *, dist: str | None, reproducible: bool) -> Any:
        """A DataLoader that resumes sample-exactly when ``reproducible`` (see :mod:`._dataloader`).

        Sharding (``dist``) belongs to the distributed driver; this one returns ``dataloader`` then.
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
        """Seed oneflow's default generators and every module-owned one (Dropout's), see :mod:`._rng`."""
        _rng.seed_all(self.unwrap_model(), seed)

    # ------------------------------------------------- training state (checkpoints)
    def _load_optimizer_state(self, optimizer: Any, state: Any, where: str) -> None:
        """Load ``state`` after restoring its int parameter keys (see :func:`.state.optimizer_state_for_load`)."""
        prepared = _state.optimizer_state_for_load(state, where)
        try:
            optimizer.load_state_dict(prepared)
        except (ValueError, KeyError) as exc:
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
        return _rng.rng_state(self.unwrap_model())

    def load_rng_state(self, state: Mapping[str, Any]) -> None:
        _rng.load_rng_state(state, self.unwrap_model())

    def framework_version(self) -> str:
        return str(flow.__version__)

    # ----------------------------------------------------------------- describing
    def describe(self) -> str:
        return (f"oneflow driver (OneflowSingleDriver) device={self.device} precision={self.precision} "
                f"oneflow={flow.__version__}")
