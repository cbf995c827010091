"""The shared skeleton of a driver for a framework with modules, optimizers and dataloaders.

torch, paddle, jittor and oneflow drive their models the same way: a module with
``train()``/``eval()``, optimizers over parameter groups, a loss tensor to run
backward on, a DataLoader over a Dataset, tensors saved without pickle. What differs
is small: the framework's types, how a tensor becomes numpy, how gradients are clipped
and scaled, how state is read. :class:`ModuleDriver` holds the common part once; a
backend subclasses it, names its types in class attributes and implements the few
hooks marked *framework*. Everything a hook does not cover stays overridable.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from types import ModuleType
from typing import Any

import numpy as np

from .._common import DriverError, bool_option
from ._checks import check_framework_kwargs, check_lrs, check_model_type
from ._driver import Driver
from ._state_codec import gradient_copies

NULL_CONTEXT = contextlib.nullcontext()
"""One shared no-op context (``auto_cast`` in full precision), so the hot path allocates none."""
_ABSENT = object()


def call_through_wrapper(wrapper: Any, module: Any, method: str, args: tuple, kwargs: dict) -> Any:
    """Run ``module.<method>(*args, **kwargs)`` inside ``wrapper``'s forward, and return what it returns.

    A data-parallel or sharding wrapper (torch's DDP, paddle's group sharding, an engine)
    sets up the gradient reduction (and counts the micro-batch) only around its own
    forward, so a training method other than ``forward`` (``train_step``) must run there.
    The module's ``forward`` is replaced for exactly one call, and put back before the
    method runs, so a method calling ``self(...)`` reaches the real forward.
    """
    target = getattr(module, method)
    saved = module.__dict__.get("forward", _ABSENT)

    def restore() -> None:
        if saved is _ABSENT:
            module.__dict__.pop("forward", None)
        else:
            module.__dict__["forward"] = saved

    def once(*a: Any, **k: Any) -> Any:
        restore()
        return target(*a, **k)

    module.__dict__["forward"] = once
    try:
        return wrapper(*args, **kwargs)
    finally:
        restore()


class ModuleDriver(Driver):
    """A single-process driver template: subclass it, set the class attributes, implement the hooks.

    Class attributes a backend sets:

    - ``framework``: the framework's module (``torch``), for its version and messages.
    - ``module_type``, ``optimizer_type``, ``tensor_type``, ``dataloader_type``,
      ``dataset_type``: the framework's classes the driver accepts or recognises.
    - ``accepted_kwargs``: ``{option: meaning}`` of ``<name>_kwargs``.
    - ``distributed_only_kwargs``: options that only a distributed run accepts (refused here
      with a hint to train distributed: ``distributed_hint``).
    - ``optimizer_example`` / ``dataloader_example`` / ``loss_example`` / ``to_tensor_example`` /
      ``tensor_dataloader_example``: code shown in error messages (a classification loss of ``outputs`` and
      ``batch['label']``; a numpy ``array`` made a tensor; arrays ``x`` and ``y`` made a dataloader, for the
      user who passes the data itself as ``train_dataloader``).
    - ``state_ops``: the backend's state module, with ``model_state(model)``,
      ``load_model_state(model, state)``, ``frozen_parameter_names(model)`` (optional), ``tensor_buffer(tensor)``,
      ``tensors_from_bytes(data)``, ``gradient_copy(grad)`` (a parameter's gradient copied to the host, or None
      to leave it out; or ``gradient_state(model)`` for a model without torch's ``named_parameters``),
      ``load_gradient_state(model, grads)`` and ``optimizer_state_for_load(state, where)``; or, for a
      backend that keys optimizer state by parameter name itself, ``optimizer_state(model, optimizer, where)``
      and ``load_optimizer_state(model, optimizer, state, where)``.
    - ``optimizer_load_errors``: the exceptions a framework's ``load_state_dict`` raises for
      a state of other parameter groups (reported with the fix).
    - ``rng_ops``: the backend's RNG module, with ``rng_state()`` and ``load_rng_state(state)``
      (or override :meth:`rng_state` / :meth:`load_rng_state`).
    - ``data_ops``: the backend's dataloader module, with ``reproducible_dataloader(dataloader)`` and, optionally,
      ``reseed_for_epoch(dataloader, epoch)`` (or override :meth:`reproducible_dataloader`).

    A framework with torch's API (``nn.Module``, ``optim.Optimizer``, ``utils.data.DataLoader``) can name its
    classes and examples in one keyword: ``class MyDriver(ModuleDriver, torch_style="oneflow")`` sets, from
    ``framework``, every class attribute above the class body does not set itself.
    - ``not_here_kwargs``: ``{option: why it does not apply here}`` for other options refused with a hint.

    Attributes :meth:`configure` may set: ``_precision`` (an object with ``autocast()``, ``state()``
    and ``load_state(state)``) and ``grad_scaler`` (one with torch's ``GradScaler`` API:
    ``scale``, ``unscale_``, ``step``, ``update``), which :meth:`auto_cast`, :meth:`run_backward`
    and :meth:`step` use.

    Hooks (framework): :meth:`resolve_device`, :meth:`configure`, :meth:`no_grad`,
    :meth:`optimizer_params`, ``backward(loss)`` (no default: check the loss, :meth:`raise_bad_loss` words
    the error, then :meth:`run_backward` or the framework's own call),
    :meth:`clip_gradients`, :meth:`move_data_to_device`, :meth:`tensor_to_numpy`,
    :meth:`reproducible_dataloader`, :meth:`seed`, :meth:`rng_state`, :meth:`load_rng_state`.
    The defaults of :meth:`no_grad` and :meth:`clip_gradients` call the framework's torch-style
    ``no_grad()`` and ``nn.utils.clip_grad_norm_`` / ``clip_grad_value_``.
    """

    framework: ModuleType
    module_type: type
    module_name: str = "module"
    """How messages name ``module_type`` (``"torch.nn.Module"``)."""
    optimizer_type: type
    optimizer_name: str = "optimizer"
    """How messages name ``optimizer_type`` (``"torch.optim.Optimizer"``)."""
    tensor_type: type | tuple[type, ...]
    dataloader_type: type | None = None
    dataset_type: type | None = None
    accepted_kwargs: Mapping[str, str] = {}
    distributed_only_kwargs: tuple[str, ...] = ()
    distributed_hint: str = "train distributed"
    not_here_kwargs: Mapping[str, str] = {}
    optimizer_example: str = "an optimizer over model.parameters()"
    dataloader_example: str = "a DataLoader(dataset, batch_size=32, shuffle=True)"
    loss_example: str = "torch.nn.functional.cross_entropy(outputs, batch['label'])"
    to_tensor_example: str = "torch.as_tensor(array)"
    tensor_dataloader_example: str = "a DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)"
    no_grad_advice: str = (": did you compute it under no_grad or detach it? (Also check that the model has "
                           "trainable parameters.)")
    """What follows "the model's output 'loss' does not require grad": the framework's words for a tensor
    cut off from the gradient and the ways that happens (``" (stop_gradient=True): ... paddle.no_grad() ..."``)."""
    state_ops: Any = None
    optimizer_load_errors: tuple[type[BaseException], ...] = (ValueError,)
    rng_ops: Any = None
    data_ops: Any = None
    _precision: Any = None
    grad_scaler: Any = None

    def __init_subclass__(cls, torch_style: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if torch_style is not None:
            for key, value in _torch_style_attributes(cls.framework, torch_style).items():
                if key not in cls.__dict__:
                    setattr(cls, key, value)

    modules_walk = "named_modules"
    """The model's method listing ``(path, submodule)`` pairs (paddle's is ``named_sublayers``)."""

    def __init__(self, model: Any, device: Any, *, precision: str = "fp32", grad_clip: float | None = None,
                 grad_clip_type: str = "norm", model_wo_auto_param_call: bool = False,
                 framework_kwargs: Mapping[str, Any] | None = None) -> None:
        self.check_model(model)
        super().__init__(model, precision=precision, grad_clip=grad_clip, grad_clip_type=grad_clip_type,
                         model_wo_auto_param_call=model_wo_auto_param_call)
        options = self.check_options(framework_kwargs)
        self.device = self.resolve_device(device, model)
        self.stepped_optimizers: list[Any] | None = None  # per instance: read by every step
        self.configure(options)

    # ------------------------------------------------------------ construction
    @classmethod
    def check_model(cls, model: Any) -> None:
        """Refuse a model that is not the framework's module type, naming what it is and the driver that fits it."""
        check_model_type(model, cls.module_type, driver=cls.name, expected=cls.module_name,
                         forward=cls.default_forward_name)

    @classmethod
    def check_options(cls, framework_kwargs: Any, accepted: Mapping[str, str] | None = None) -> dict[str, Any]:
        """``<name>_kwargs`` checked against ``accepted`` (default: this driver's options)."""
        accepted = cls.accepted_kwargs if accepted is None else accepted
        not_here = {key: f"applies to distributed {cls.name} training, but this run is a single process; remove "
                         f"it, or {cls.distributed_hint}."
                    for key in cls.distributed_only_kwargs if key not in accepted}
        not_here.update(cls.not_here_kwargs)
        return check_framework_kwargs(framework_kwargs, accepted, argument=f"{cls.name}_kwargs", not_here=not_here)

    def resolve_device(self, device: Any, model: Any) -> Any:
        """(framework) The device ``device`` names, checked; raise a DriverError naming what is accepted."""
        raise NotImplementedError

    def configure(self, options: dict[str, Any]) -> None:
        """(framework) Apply the checked ``<name>_kwargs`` (precision machinery, per-batch settings)."""

    def flag_option(self, options: Mapping[str, Any], key: str, default: bool) -> bool:
        """``options[key]`` (or ``default``) of ``<name>_kwargs``, refused unless it is a real bool."""
        return bool_option(options, key, default, argument=f"{self.name}_kwargs")

    # ----------------------------------------------------------------- model
    def setup(self) -> None:
        """Move the model to the driver's device (parameters keep their identity, so optimizers stay valid)."""
        self.model.to(self.device)

    def set_model_mode(self, mode: str) -> None:
        if mode == "train":
            self.model.train()
        elif mode == "eval":
            self.model.eval()
        else:
            raise DriverError(f"set_model_mode(mode={mode!r}) accepts 'train' or 'eval'.")

    def no_grad(self) -> contextlib.AbstractContextManager:
        """(framework) The framework's ``no_grad()`` context."""
        return self.framework.no_grad()

    def scalars_to_numpy(self, values: list[Any]) -> np.ndarray:
        """Stacked on the device (``framework.stack``) and read in one copy; one by one when they do not stack."""
        if len(values) > 1 and all(self.is_tensor(value) for value in values):
            try:
                with self.no_grad():
                    stacked = self.framework.stack(values)
            except Exception:  # shapes that differ (a loss that was not reduced): one by one
                return super().scalars_to_numpy(values)
            array = self.tensor_to_numpy(stacked).astype(np.float64)
            return array if array.ndim == 1 else array.reshape(len(values), -1).mean(axis=1)
        return super().scalars_to_numpy(values)

    def auto_cast(self) -> contextlib.AbstractContextManager:
        """The precision machinery's ``autocast()`` context (none without one)."""
        return NULL_CONTEXT if self._precision is None else self._precision.autocast()

    # ---------------------------------------------------------- optimisation
    def optimizer_params(self, optimizer: Any) -> list[Any]:
        """(framework) The parameters ``optimizer`` updates, in order."""
        return [p for group in optimizer.param_groups for p in group["params"]]

    def _check_optimizer(self, optimizer: Any) -> str | None:
        if not isinstance(optimizer, self.optimizer_type):
            framework = (type(optimizer).__module__ or "").split(".")[0]
            origin = f" (a {framework} object)" if framework and framework not in ("builtins", self.name) else ""
            return (f"is not a {self.optimizer_name}{origin}; the {self.name} driver needs a {self.name} optimizer, "
                    f"e.g. {self.optimizer_example}.")
        own = {id(p) for p in self.unwrap_model().parameters()}
        params = self.optimizer_params(optimizer)
        if params and not any(id(p) in own for p in params):
            return (
                f"none of its {len(params)} parameter(s) belong to the model {type(self.unwrap_model()).__name__}, "
                "so stepping it would never change the model. Was it built from another model instance (e.g. "
                "before the model was re-created or deep-copied)? Build it from this model's parameters."
            )
        return None

    def run_backward(self, loss: Any) -> None:
        """(framework) Backward from a checked loss (scaled by ``grad_scaler`` first when there is one)."""
        scaler = self.grad_scaler
        (loss if scaler is None else scaler.scale(loss)).backward()

    def raise_bad_loss(self, loss: Any) -> None:
        """The error for a loss that is not a tensor, has more than one element, or has no gradient path."""
        if not isinstance(loss, self.tensor_type):
            raise DriverError(
                f"the model's output 'loss' is a {type(loss).__name__} ({loss!r:.60}), not a {self.name} tensor; "
                "return the loss tensor itself (do not call .item() or float() on it)."
            )
        self.check_single_value(loss)
        raise DriverError(f"the model's output 'loss' does not require grad{self.no_grad_advice}")

    def check_single_value(self, loss: Any) -> None:
        """A loss with several elements cannot be backpropagated: say how to reduce it."""
        if loss.numel() != 1:
            raise self.multi_value_error(loss)

    def multi_value_error(self, loss: Any) -> DriverError:
        """The error for a ``loss`` with more than one element: backward needs a single number.

        Such a value is often not a loss at all: a model returning its predictions (logits) without
        ``loss_fn`` hands them to backward. A loss per sample (one dimension) is reduced in the model; a
        value with a batch and a class dimension is predictions, for which ``loss_fn`` is the fix.
        """
        shape = tuple(int(d) for d in loss.shape)
        outputs_fix = (
            f"if the model returns its predictions (logits) rather than a loss, tell the Trainer how to compute "
            f"the loss: loss_fn=lambda outputs, batch: {self.loss_example} "
            "(with your labels' key in the batch), or output_mapping= to name the loss "
            "among the outputs of a model that returns a dict or tuple"
        )
        reduce_fix = "if it is a loss per sample, reduce it in the model (or in loss_fn), e.g. loss.mean()"
        fixes = (outputs_fix, reduce_fix) if len(shape) > 1 else (reduce_fix, outputs_fix)
        looks = " (it looks like predictions: a batch of values per class, not a loss)" if len(shape) > 1 else ""
        return DriverError(
            f"the value backpropagated as the loss has shape {shape}; backward needs a single number{looks}. "
            f"{fixes[0][0].upper()}{fixes[0][1:]}; {fixes[1]}."
        )

    def clip_gradients(self, params: list[Any]) -> Any:
        """(framework) Clip the gradients of ``params`` to ``grad_clip`` by norm or by value.

        Returns the total norm before clipping when clipping by norm (a framework scalar, not
        read here), else None.
        """
        utils = self.framework.nn.utils
        if self.grad_clip_type == "norm":
            return utils.clip_grad_norm_(params, self.grad_clip)
        utils.clip_grad_value_(params, self.grad_clip)
        return None

    def trainable_params(self) -> list[Any]:
        """Every parameter of every optimizer, for clipping."""
        return [p for optimizer in self.optimizers for p in self.optimizer_params(optimizer)]

    # ``stepped_optimizers``: what :meth:`step` steps when set, wrappers of the optimizers (a distributed
    # driver's); None steps ``optimizers``.
    def step(self) -> None:
        """Clip (the unscaled gradients, under a ``grad_scaler``), then step every optimizer."""
        scaler = self.grad_scaler
        optimizers = self.optimizers if self.stepped_optimizers is None else self.stepped_optimizers
        if self.grad_clip is not None:
            if scaler is not None:
                for optimizer in optimizers:
                    scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
            self.grad_norm = self.clip_gradients(self.trainable_params())
        if scaler is None:
            for optimizer in optimizers:
                optimizer.step()
            return
        for optimizer in optimizers:
            scaler.step(optimizer)
        scaler.update()

    def zero_grad(self) -> None:
        for optimizer in self.optimizers:
            optimizer.zero_grad()

    def get_lrs(self) -> list[list[float]]:
        return [[float(group["lr"]) for group in optimizer.param_groups] for optimizer in self.optimizers]

    def set_lrs(self, lrs: list[list[float]]) -> None:
        checked = check_lrs(lrs, [len(optimizer.param_groups) for optimizer in self.optimizers])
        for optimizer, rates in zip(self.optimizers, checked, strict=True):
            for group, lr in zip(optimizer.param_groups, rates, strict=True):
                self.set_group_lr(group, lr)

    def set_group_lr(self, group: Any, lr: float) -> None:
        """Write one param group's learning rate (a tensor rate is filled in place by the torch driver)."""
        group["lr"] = lr

    # ------------------------------------------------------------------ data
    def is_tensor(self, obj: Any) -> bool:
        return isinstance(obj, self.tensor_type)

    def check_dataloader_legality(self, dataloader: Any, argument: str = "train_dataloader") -> None:
        if self.dataloader_type is not None and isinstance(dataloader, self.dataloader_type):
            return
        if self.dataset_type is not None and isinstance(dataloader, self.dataset_type) and not hasattr(
                dataloader, "__iter__"):
            raise DriverError(
                f"{argument}={type(dataloader).__name__} is a Dataset, not a dataloader; wrap it, e.g. "
                f"{self.dataloader_example}."
            )
        super().check_dataloader_legality(dataloader, argument)

    def reproducible_dataloader(self, dataloader: Any) -> Any:
        """(framework) ``dataloader`` with a :class:`~drivetrain.ReproducibleBatchSampler`, or as is
        (``data_ops.reproducible_dataloader`` where the backend names its dataloader module)."""
        return dataloader if self.data_ops is None else self.data_ops.reproducible_dataloader(dataloader)

    def set_sampler_epoch(self, dataloader: Any, epoch: int) -> None:
        super().set_sampler_epoch(dataloader, epoch)
        reseed = getattr(self.data_ops, "reseed_for_epoch", None)
        if reseed is not None:
            reseed(dataloader, epoch)

    def set_dist_repro_dataloader(self, dataloader: Any, *, dist: str | None, reproducible: bool) -> Any:
        """A dataloader that resumes sample-exactly when ``reproducible``; sharding (``dist``) is the distributed
        driver's: asked of this one, it is refused rather than silently not done."""
        if dist not in (None, "train", "eval"):
            raise DriverError(f"set_dist_repro_dataloader(dist={dist!r}): use None, 'train' or 'eval'.")
        if dist is not None:
            raise DriverError(
                f"set_dist_repro_dataloader(dist={dist!r}): sharding data across processes needs the distributed "
                f"{self.name} driver ({self.distributed_hint}); {type(self).__name__} drives a single process.")
        return self.reproducible_dataloader(dataloader) if reproducible else dataloader

    # ----------------------------------------------------------------- state
    def model_state(self) -> dict[str, Any]:
        return dict(self.state_ops.model_state(self.unwrap_model()))

    def load_model_state(self, state: Mapping[str, Any]) -> None:
        self.state_ops.load_model_state(self.unwrap_model(), state)

    def module_classes(self) -> dict[str, tuple[str, ...]]:
        """Every module's class names along its MRO, by path, from the model's ``modules_walk`` method."""
        model = self.unwrap_model()
        walk = dict(getattr(model, self.modules_walk)())
        walk.setdefault("", model)
        return {path: tuple(c.__name__ for c in type(module).__mro__ if c is not object) for path, module in walk.items()}

    def frozen_parameter_names(self) -> frozenset[str]:
        """``state_ops.frozen_parameter_names(model)`` where the backend's state module has it, else none."""
        names = getattr(self.state_ops, "frozen_parameter_names", None)
        return frozenset() if names is None else frozenset(names(self.unwrap_model()))

    def tensor_buffer(self, tensor: Any) -> tuple[str, tuple[int, ...], memoryview]:
        return self.state_ops.tensor_buffer(tensor)

    def tensors_from_bytes(self, data: bytes) -> dict[str, Any]:
        return dict(self.state_ops.tensors_from_bytes(data))

    def gradient_state(self) -> dict[str, Any]:
        """``gradient_copies`` of the model's ``named_parameters`` with ``state_ops.gradient_copy(grad)`` (a host
        copy, or None to leave a gradient out) where the state module has it, else ``state_ops.gradient_state``."""
        model = self.unwrap_model()
        copy = getattr(self.state_ops, "gradient_copy", None)
        if copy is not None:
            return gradient_copies(model.named_parameters(), copy)
        return dict(self.state_ops.gradient_state(model))

    def load_gradient_state(self, grads: Mapping[str, Any]) -> None:
        self.state_ops.load_gradient_state(self.unwrap_model(), grads)

    def _optimizer_state(self, optimizer: Any, where: str) -> Any:
        """``state_ops.optimizer_state(model, optimizer, where)`` where the state module keys optimizer state by
        parameter name itself (paddle, jittor), else the framework's ``state_dict()``."""
        by_name = getattr(self.state_ops, "optimizer_state", None)
        return super()._optimizer_state(optimizer, where) if by_name is None else by_name(
            self.unwrap_model(), optimizer, where)

    def _load_optimizer_state(self, optimizer: Any, state: Any, where: str) -> None:
        """``state_ops.load_optimizer_state(model, optimizer, state, where)`` where the state module has it;
        else load ``state`` after restoring what saving changed (int parameter keys), naming the fix on a mismatch."""
        by_name = getattr(self.state_ops, "load_optimizer_state", None)
        if by_name is not None:
            by_name(self.unwrap_model(), optimizer, state, where)
            return
        prepared = self.state_ops.optimizer_state_for_load(state, where)
        try:
            optimizer.load_state_dict(prepared)
        except self.optimizer_load_errors as exc:
            raise DriverError(
                f"load_optimizer_states: {exc}; build the optimizers over the same parameters, in the same "
                "groups, as the run that saved the checkpoint."
            ) from exc

    def precision_state(self) -> Any:
        return None if self._precision is None else self._precision.state()

    def load_precision_state(self, state: Any) -> None:
        if self._precision is not None:
            self._precision.load_state(state)

    def _rng_module(self) -> Any:
        if self.rng_ops is None:
            raise NotImplementedError(
                f"{type(self).__qualname__} sets no rng_ops: set it to a module with rng_state() and "
                "load_rng_state(state), or override rng_state and load_rng_state."
            )
        return self.rng_ops

    def rng_state(self) -> dict[str, Any]:
        return self._rng_module().rng_state()

    def load_rng_state(self, state: Mapping[str, Any]) -> None:
        self._rng_module().load_rng_state(state)

    def framework_version(self) -> str:
        return str(self.framework.__version__)

    def describe(self) -> str:
        """One line naming the driver class, device, precision (as it runs: ``_precision.describe()``) and
        framework version."""
        precision = self.precision if self._precision is None else self._precision.describe()
        return (f"{self.name} driver ({type(self).__qualname__}) device={self.device} precision={precision} "
                f"{self.name}={self.framework_version()}")


def _torch_style_attributes(framework: ModuleType, prefix: str) -> dict[str, Any]:
    """The classes and message examples of a framework with torch's API, ``prefix`` its import name."""
    data = framework.utils.data
    return {
        "module_type": framework.nn.Module, "module_name": f"{prefix}.nn.Module",
        "optimizer_type": framework.optim.Optimizer,
        "optimizer_name": f"{prefix}.optim.Optimizer",
        "tensor_type": framework.Tensor,
        "dataloader_type": data.DataLoader, "dataset_type": data.Dataset,
        "loss_example": f"{prefix}.nn.functional.cross_entropy(outputs, batch['label'])",
        "to_tensor_example": f"{prefix}.as_tensor(array)",
        "dataloader_example": f"{prefix}.utils.data.DataLoader(dataset, batch_size=32, shuffle=True)",
        "tensor_dataloader_example": (f"{prefix}.utils.data.DataLoader({prefix}.utils.data.TensorDataset("
                                      f"{prefix}.as_tensor(x), {prefix}.as_tensor(y)), batch_size=32, shuffle=True)"),
    }
