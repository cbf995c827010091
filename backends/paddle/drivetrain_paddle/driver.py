"""The single-process paddle driver (:mod:`.factory` builds it, or the distributed one).

Every argument (device, model, precision, framework options) is validated up front, by
the factory and the constructor, so a wrong input fails when the Trainer is built, not
in the middle of the first epoch. The per-batch methods (``move_data_to_device``,
``auto_cast``, ``backward``, ``step``, ``zero_grad``) do as little as possible.

The shared skeleton (checks, mode switching, state pass-throughs) is the core's
:class:`drivetrain.backend.ModuleDriver`; what paddle does its own way stays here:
one learning rate per optimizer with per-group multipliers, optimizer state keyed by
parameter names, ``clear_grad``, O2 decoration, static-graph training, and a
process-wide current device: :meth:`PaddleSingleDriver.setup` sets it
(``paddle.set_device``) so that tensors the model creates in ``forward`` land on the
driver's device, and moves the model there.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import paddle

from drivetrain.backend import DriverError, ModuleDriver, check_lrs

from . import _dataloader, _rng
from . import state as _state
from ._dataloader import check_workers_and_tensors
from ._device import Device, Mover, resolve_device
from ._dist_plan import DIST_KWARGS
from .plugin import CAPABILITIES
from .precision import SCALER_KWARGS, Precision
from .static import StaticTraining, quiet

FRAMEWORK_KWARGS: dict[str, str] = {
    "amp_level": "'O1' (default) or 'O2': paddle.amp.auto_cast level for precision='fp16'/'bf16'",
    **SCALER_KWARGS,
    "to_static": "bool: train through paddle.jit.to_static (a static program) instead of eager mode",
    "input_spec": "list of paddle.static.InputSpec for to_static, one per forward parameter in order",
    "full_graph": "bool (default True): to_static converts the whole forward (True) or falls back to eager "
    "code where it cannot (False, paddle's SOT mode)",
    "set_to_zero": "bool (default False): zero_grad fills gradients with zeros instead of releasing them",
}

_NUMPY_LESS_FLOATS = (paddle.float16, paddle.bfloat16, paddle.float8_e4m3fn, paddle.float8_e5m2)


class PaddleSingleDriver(ModuleDriver):
    """Drives a ``paddle.nn.Layer`` in one process on one device (the CPU or one GPU)."""

    name = "paddle"
    capabilities = CAPABILITIES
    framework = paddle
    module_type, module_name = paddle.nn.Layer, "paddle.nn.Layer"
    modules_walk = "named_sublayers"
    optimizer_type, optimizer_name = paddle.optimizer.Optimizer, "paddle.optimizer.Optimizer"
    loss_example = "paddle.nn.functional.cross_entropy(outputs, batch['label'])"
    to_tensor_example = "paddle.to_tensor(array)"
    no_grad_advice = (" (stop_gradient=True): did you compute it under paddle.no_grad() or detach it? (Also check "
                      "that the model has trainable parameters.)")
    optimizer_example = "paddle.optimizer.AdamW(learning_rate=1e-3, parameters=model.parameters())"
    tensor_type = paddle.Tensor
    dataloader_type, dataset_type = paddle.io.DataLoader, paddle.io.Dataset
    dataloader_example = "paddle.io.DataLoader(dataset, batch_size=32, shuffle=True)"
    tensor_dataloader_example = ("paddle.io.DataLoader(paddle.io.TensorDataset([paddle.to_tensor(x), "
                                 "paddle.to_tensor(y)]), batch_size=32, shuffle=True)")
    accepted_kwargs: Mapping[str, str] = FRAMEWORK_KWARGS
    """The ``paddle_kwargs`` keys this driver understands, with what each means."""
    distributed_only_kwargs = tuple(DIST_KWARGS)
    distributed_hint = ("train distributed: device=[0, 1], nproc=N, or start the script with python -m "
                        "paddle.distributed.launch")
    state_ops = _state
    data_ops = _dataloader
    rng_ops = _rng
    device: Device

    def resolve_device(self, device: Any, model: Any) -> Device:
        return resolve_device(device, model)

    def configure(self, options: dict[str, Any]) -> None:
        self._move = Mover(self.device)
        self.set_to_zero = self.flag_option(options, "set_to_zero", False)
        self._precision = Precision(self.precision, self.device, options.get("amp_level"),
                                    {k: v for k, v in options.items() if k in SCALER_KWARGS})
        self.grad_scaler = self._precision.scaler
        self.static: StaticTraining | None = None
        if self.flag_option(options, "to_static", False):
            self.static = StaticTraining(self.model, options.get("input_spec"),
                                         self.flag_option(options, "full_graph", True))
        elif "input_spec" in options or "full_graph" in options:
            raise DriverError(
                "paddle_kwargs['input_spec'] / ['full_graph'] configure static-graph training, but to_static is "
                "not True; add 'to_static': True or remove them (for an inference model use "
                "drivetrain_paddle.export_inference_model)."
            )
        self._params: list[Any] = []

    # ------------------------------------------------------------------ lifecycle
    def setup(self) -> None:
        """Make the device paddle's current one, move the model there, then apply O2 and to_static.

        ``Layer.to`` keeps parameter identity, so optimizers built before stay valid.
        """
        paddle.set_device(self.device.name)
        if not all(self._move.in_place(t) for t in [*self.model.parameters(), *self.model.buffers()]):
            self.model.to(device=self.device.name)
        self._precision.decorate(self.model, self.optimizers)
        if self.static is not None:
            self.static.convert()

    # ---------------------------------------------------------------------- model
    def get_model_call_fn(self, fn_name: str | None, default: str = "train_step") -> tuple[Callable, Callable]:
        fn, signature_fn = super().get_model_call_fn(fn_name, default)
        if self.static is not None and fn is self.model:
            signature_fn = self.static.forward  # the converted forward has no inspectable signature
        return fn, signature_fn

    def model_call(self, batch: Any, fn: Callable, signature_fn: Callable | None) -> Any:
        if self.static is None:
            return super().model_call(batch, fn, signature_fn)
        if fn is self.model and isinstance(batch, Mapping) and not self.model_wo_auto_param_call:
            self.static.check_batch(batch)
        with quiet():
            return super().model_call(batch, fn, signature_fn)

    # --------------------------------------------------------------- optimisation
    def optimizer_params(self, optimizer: Any) -> list[Any]:
        return _state.parameters_of(optimizer)

    def _check_optimizer(self, optimizer: Any) -> str | None:
        if isinstance(optimizer, paddle.optimizer.Optimizer) and not self.optimizer_params(optimizer):
            return (
                "has no parameters; build it with parameters=model.parameters() (in eager mode paddle "
                "optimizers update only the parameters they were given)."
            )
        return super()._check_optimizer(optimizer)

    def set_optimizers(self, optimizers: Any) -> None:
        super().set_optimizers(optimizers)
        trainable = {id(p): p for optimizer in self.optimizers for p in self.optimizer_params(optimizer)
                     if not p.stop_gradient}
        self._params = list(trainable.values())  # for clipping: every trainable parameter once, in order

    def trainable_params(self) -> list[Any]:
        return self._params

    def backward(self, loss: Any) -> None:
        """The template's checks in one condition (this runs every step), then its backward. ``shape`` first: a
        0-d loss is the usual and ``size`` costs microseconds; paddle would backpropagate a vector loss silently."""
        if not isinstance(loss, paddle.Tensor) or loss.stop_gradient or (loss.shape and loss.size != 1):
            self.raise_bad_loss(loss)  # says which of the three
        self.run_backward(loss)

    def zero_grad(self) -> None:
        for optimizer in self.optimizers:
            optimizer.clear_grad(set_to_zero=self.set_to_zero)

    def get_lrs(self) -> list[list[float]]:
        """paddle's one rate per optimizer times each param group's multiplier (its ``learning_rate``)."""
        return [[float(opt.get_lr()) * m for m in _state.lr_multipliers(opt, f"optimizers[{i}]")]
                for i, opt in enumerate(self.optimizers)]

    def set_lrs(self, lrs: list[list[float]]) -> None:
        groups = [len(_state.lr_multipliers(opt, f"optimizers[{i}]")) for i, opt in enumerate(self.optimizers)]
        checked = check_lrs(lrs, groups)
        rates = [_state.rate_for(opt, r, f"optimizers[{i}]")
                 for i, (opt, r) in enumerate(zip(self.optimizers, checked, strict=True))]
        for opt, rate in zip(self.optimizers, rates, strict=True):  # every optimizer checked before any is changed
            opt.set_lr(rate)

    # ----------------------------------------------------------------------- data
    def move_data_to_device(self, batch: Any) -> Any:
        return self._move.move(batch)

    def tensor_to_numpy(self, tensor: Any) -> np.ndarray:
        if not isinstance(tensor, paddle.Tensor):
            return np.asarray(tensor)
        if tensor.dtype in _NUMPY_LESS_FLOATS:
            tensor = tensor.astype(paddle.float32)  # numpy has no bfloat16 / float8
        return tensor.detach().numpy()  # always a host copy

    def check_dataloader_legality(self, dataloader: Any, argument: str = "train_dataloader") -> None:
        if isinstance(dataloader, paddle.io.DataLoader):
            check_workers_and_tensors(dataloader, argument)
        super().check_dataloader_legality(dataloader, argument)

    # ---------------------------------------------------------------------- state
    def seed(self, seed: int) -> None:
        paddle.seed(seed)  # the CPU generator and every GPU's

    def rng_state(self) -> dict[str, Any]:
        return _rng.rng_state(include_gpu=self.device.kind == "gpu")

    # ----------------------------------------------------------------- describing
    def describe(self) -> str:
        described = super().describe()
        return described if self.static is None else described.replace(" paddle=", " static graph (to_static) paddle=")
