"""The jax driver: a ``flax.nnx.Module`` trained with one ``nnx.Optimizer`` in one process.

The step contract's functional side: :meth:`JaxDriver.forward_backward` computes a batch's loss and gradients in
one compiled ``jax.value_and_grad`` (``Capabilities(separate_backward=False)``), keeps them (adding up an
accumulation cycle) until :meth:`JaxDriver.step` clips them and calls ``optimizer.update`` in a second compiled
program. The model's variables are read and written in place (:mod:`._step`), so the user's model is always
current. JAX has no global random generator: dropout draws from the model's ``nnx.Rngs``, which is what
:meth:`rng_state` saves and :meth:`seed` reseeds.
"""

from __future__ import annotations

import collections
import types
from collections.abc import Callable, Mapping
from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from drivetrain.backend import (
    NULL_CONTEXT,
    Driver,
    DriverError,
    ModelStep,
    batch_mover,
    check_gradient_names,
    check_lrs,
    listed_names,
    loadable_model_state,
)

from . import _dataloader, state
from ._step import (
    TRACE,
    Split,
    call_program,
    dotted,
    fused_program,
    grad_program,
    split_batch,
    step_call,
    update_program,
)
from .plugin import CAPABILITIES
from .precision import apply_precision

_FUSED = object()
"""``_grads`` after a fused batch: its gradients exist only inside the program that computed its step."""
ARRAY_TYPE = type(jnp.zeros(()))
"""The concrete class of a jax array (``jax.Array`` is abstract), for the batch mover's fast path."""
INJECT = "optax.inject_hyperparams(optax.adam)(learning_rate=1e-3)"


class JaxDriver(Driver):
    """Drives a ``flax.nnx.Module`` on one device; ``device`` is a ``jax.Device`` or None (jax's default)."""

    name = "jax"
    capabilities = CAPABILITIES
    default_forward_name = "__call__"
    framework = jax
    fuses_step = True
    """Whether a batch without accumulation computes its optimizer step in the same program as its gradients."""
    optimizer_example = "nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)"
    to_tensor_example = "jnp.asarray(array)"
    tensor_dataloader_example = "drivetrain_jax.DataLoader(list(zip(x, y)), batch_size=32, shuffle=True)"

    def __init__(self, model: Any, device: Any = None, *, compile_evaluation: bool = True, **options: Any) -> None:
        super().__init__(model, **options)
        self.device = device
        self.compile_evaluation = compile_evaluation
        self.bf16_layers = apply_precision(model, self.precision)
        self.traces: collections.Counter[str] = collections.Counter()
        """How often each compiled program was traced (``train``, ``update``, ``call``): a trace is a compilation."""
        self._split: Split | None = None  # the model's variables, for the current mode (train/eval)
        self._optimizer_split: Split | None = None
        self._steps: dict[int, tuple[ModelStep, Any, Callable]] = {}  # each ModelStep's key and traced call
        self._grads: Any = None  # the pending gradients of the trained variables (a list), None or _FUSED
        self._pending: tuple | None = None  # a fused batch's (inputs, optimizer inputs, step) until step()
        self._fused_batch: tuple | None = None  # what computes its gradients again: (inputs, step, arrays, static)
        self._divisors: dict[int, Any] = {}
        self._lr_variables: list[nnx.Variable] | None = None
        self._mover = batch_mover(ARRAY_TYPE, self._in_place, self._to_device, self._movable)

    # ----------------------------------------------------------------- the model's variables
    def _model_split(self) -> Split:
        split = self._split
        if split is None:
            wrt = self.optimizers[0].wrt if self.optimizers else nnx.Nothing
            split = self._split = Split(self.model, wrt, nnx.Param, ...)
        return split

    def _opt_split(self) -> Split:
        if self._optimizer_split is None:
            self._optimizer_split = Split(self.optimizers[0], ...)
        return self._optimizer_split

    def _rebinder(self, fn: Any) -> tuple[Any, Callable[[Any], Callable]] | None:
        """``(key, rebind)`` when ``fn`` is the model or one of its methods: ``rebind(traced model)`` is the same
        function of the traced model; None for any other function."""
        if fn is self.model:
            return "__call__", lambda model: model
        if getattr(fn, "__self__", None) is self.model:
            func = fn.__func__
            return func, lambda model: types.MethodType(func, model)
        return None

    def _trace(self, call: Callable[[Any, Any], Any]) -> None:
        """What a program calls if jax traces it now (see ``_step.TRACE``)."""
        TRACE.call = call
        TRACE.traces = self.traces

    # ---------------------------------------------------------------------------- lifecycle
    def setup(self) -> None:
        """Put the model's and the optimizer's arrays on ``device`` (when one was given)."""
        if self.device is not None:
            for node in (self.model, *self.optimizers):
                for _, variable in nnx.to_flat_state(nnx.state(node)):
                    value = variable.get_raw_value()
                    if isinstance(value, jax.Array):
                        variable.set_raw_value(jax.device_put(value, self.device))
        self._split = self._optimizer_split = None

    def set_model_mode(self, mode: str) -> None:
        if mode not in ("train", "eval"):
            raise DriverError(f"set_model_mode(mode={mode!r}): use 'train' or 'eval'.")
        getattr(self.model, mode)()  # nnx's train()/eval(): Dropout's deterministic, BatchNorm's use_running_average
        self._split = None  # train()/eval() changed static attributes: the graph definition

    def no_grad(self) -> Any:
        return NULL_CONTEXT

    def auto_cast(self) -> Any:
        return NULL_CONTEXT  # bf16 is each layer's dtype (precision.py), not a context

    def no_sync(self) -> Any:
        return NULL_CONTEXT  # gradients are exchanged only when forward_backward is told sync=True

    # ---------------------------------------------------------------------------- the model
    def model_call(self, batch: Any, fn: Callable, signature_fn: Callable | None) -> Any:
        """A forward of the model (evaluation, prediction) compiled like training's; other functions run as they are."""
        rebound = self._rebinder(fn) if self.compile_evaluation else None
        if rebound is None:
            return super().model_call(batch, fn, signature_fn)
        split = self._split or self._model_split()
        local = ("call", rebound[0], getattr(signature_fn, "__name__", None), self.model_wo_auto_param_call)
        program = split.program(local, (*local, split.layout.key), lambda: call_program(split.layout))
        rebind = rebound[1]
        self._trace(lambda model, batch: Driver.model_call(self, batch, rebind(model), signature_fn))
        arrays, static = split_batch(batch)
        outputs, mutable = program(split.all_values(), arrays, static=static)
        split.write(2, mutable)
        return outputs

    # ------------------------------------------------------------------------- optimisation
    def _check_optimizer(self, optimizer: Any) -> str | None:
        if not isinstance(optimizer, nnx.Optimizer):
            return f"not a flax nnx.Optimizer; build one over the model, e.g. {self.optimizer_example}."
        return None

    def set_optimizers(self, optimizers: Any) -> None:
        super().set_optimizers(optimizers)
        if len(self.optimizers) > 1:
            self.optimizers = []
            raise DriverError(f"optimizers= lists {len(optimizers)} optimizers; the jax driver takes one nnx.Optimizer. "
                              "Give parts of the model their own optax transformations with optax.multi_transform "
                              "(each part then is one param group of get_lrs()/set_lrs()).")
        self._split = self._optimizer_split = None
        self._lr_variables = None

    def forward_backward(self, batch: Any, step: ModelStep, *, cycle_size: int = 1, sync: bool = True,
                         before_backward: Callable[[Any], None] | None = None) -> Any:
        """The batch's loss and gradients in one compiled ``jax.value_and_grad``; the gradients are kept (added to
        those of the cycle's earlier batches) until :meth:`step`, and exchanged across processes only when ``sync``."""
        split = self._split or self._model_split()
        known = self._steps.get(id(step))
        if known is None or known[0] is not step:
            if len(self._steps) > 8:  # steps made and dropped (the conformance kit makes one per batch)
                self._steps.clear()
            known = self._steps[id(step)] = (step, *self._train_key(step))
        arrays, static = split_batch(batch)
        if cycle_size == 1 and sync and self._grads is None and self.optimizers and self.fuses_step:
            return self._fused(split, known, arrays, static)
        program = split.program(("grad", known[1]), ("grad", known[1], split.layout.key),
                                lambda: grad_program(split.layout))
        self._trace(known[2])
        divisor = None
        if cycle_size != 1:
            divisor = self._divisors.get(cycle_size)
            if divisor is None:
                divisor = self._divisors[cycle_size] = jnp.asarray(float(cycle_size))
        outputs, mutable, grads = program(split.all_values(), arrays, self._gradients(), divisor, static=static)
        split.write(2, mutable)
        self._grads = self._exchange(grads) if sync else grads
        return outputs

    def _fused(self, split: Split, known: tuple, arrays: list, static: Any) -> Any:
        """A batch without accumulation: the optimizer step its gradients lead to, computed in the same program (the
        usual nnx.jit step's arithmetic, bit for bit); :meth:`step` applies it unless the state changed meanwhile."""
        opt = self._opt_split()
        clip = (self.grad_clip, self.grad_clip_type)
        program = split.program(("fused", known[1]), ("fused", known[1], split.layout.key, opt.layout.key, *clip),
                                lambda: fused_program(split.layout, opt.layout, *clip))
        self._trace(known[2])
        values, opt_values = split.all_values(), opt.values(0)
        outputs, mutable, update = program(values, opt_values, arrays, static=static)
        split.write(2, mutable)
        self._grads = _FUSED
        self._pending = (values[0], opt_values, update)
        self._fused_batch = (values, known, arrays, static)
        return outputs

    def _gradients(self) -> list[Any] | None:
        """The pending gradients; after a fused batch, computed again from its inputs (only when asked: a
        checkpoint, or a step after the state changed)."""
        if self._grads is _FUSED:
            values, known, arrays, static = self._fused_batch  # type: ignore[misc]
            split = self._split or self._model_split()
            program = split.program(("grad", known[1]), ("grad", known[1], split.layout.key),
                                    lambda: grad_program(split.layout))
            self._trace(known[2])
            self._grads = self._exchange(program(values, arrays, None, None, static=static)[2])
        return self._grads

    def _train_key(self, step: ModelStep) -> tuple[Any, Callable]:
        """``(key, call)``: what the train programs' trace depends on, and the traced call of ``step``."""
        rebound = self._rebinder(step.fn)
        if rebound is None:
            raise DriverError(
                f"train_fn={getattr(step.fn, '__qualname__', step.fn)!r} is not a method of the model: the jax driver "
                "takes the gradients with respect to the model it passes to the compiled step, so the train function "
                "must be the model's own (its __call__, train_step or a method named by train_fn=).")
        key = (rebound[0], step.output_fn, step.loss_fn, step.what, self.model_wo_auto_param_call)
        return key, step_call(step, rebound[1])

    def _exchange(self, grads: list[Any]) -> list[Any]:
        """The gradients every process agrees on at a cycle's end: one process has nothing to exchange."""
        return grads

    def step(self) -> None:
        """Clip the pending gradients (when asked) and apply them with ``optimizer.update``, compiled; after a batch
        without accumulation, the step its program computed already (unless the state changed in between)."""
        if self._grads is None or not self.optimizers:
            return
        split, opt = self._split or self._model_split(), self._opt_split()
        pending = self._pending
        if pending is not None and _same(split.variables[0], pending[0]) and _same(opt.variables[0], pending[1]):
            trained, opt_values, norm = pending[2]
        else:
            clip = (self.grad_clip, self.grad_clip_type)
            program = split.program(("update",), ("update", split.layout.key, opt.layout.key, *clip),
                                    lambda: update_program(split.layout, opt.layout, *clip))
            TRACE.traces = self.traces
            trained, opt_values, norm = program(split.all_values(), opt.values(0), self._gradients())
        self._pending = None
        split.write(0, trained)
        opt.write(0, opt_values)
        if norm is not None:
            self.grad_norm = norm

    def zero_grad(self) -> None:
        self._grads = self._pending = self._fused_batch = None

    def _learning_rates(self) -> list[nnx.Variable]:
        if self._lr_variables is None:
            if not self.optimizers:
                raise DriverError("get_lrs()/set_lrs(): the jax driver has no optimizer; pass optimizers=.")
            found = [variable for path, variable in nnx.to_flat_state(nnx.state(self.optimizers[0]))
                     if path[-2:] == ("hyperparams", "learning_rate")]
            if not found:
                raise DriverError("the optimizer's learning rate cannot change between steps (a schedule needs it): "
                                  "build its optax transformation with optax.inject_hyperparams, e.g. "
                                  f"nnx.Optimizer(model, {INJECT}, wrt=nnx.Param).")
            self._lr_variables = found
        return self._lr_variables

    def get_lrs(self) -> list[list[float]]:
        """The learning rate of each ``optax.inject_hyperparams`` inside the optimizer (one param group each)."""
        return [[float(np.asarray(variable.get_raw_value())) for variable in self._learning_rates()]]

    def set_lrs(self, lrs: list[list[float]]) -> None:
        variables = self._learning_rates()
        for variable, lr in zip(variables, check_lrs(lrs, [len(variables)])[0], strict=True):
            old = variable.get_raw_value()
            variable.set_raw_value(jax.device_put(jnp.asarray(lr, old.dtype), old.sharding))

    # -------------------------------------------------------------------------------- data
    def move_data_to_device(self, batch: Any) -> Any:
        """Every jax array of ``batch`` on the device, numeric numpy arrays (and torch tensors) made jax arrays."""
        return self._mover(batch)

    def _movable(self, value: Any) -> bool:
        if isinstance(value, jax.Array):
            return True
        if isinstance(value, np.ndarray):
            return value.dtype.kind in "biuf" or value.dtype == jnp.bfloat16
        return type(value).__module__ == "torch" and hasattr(value, "numpy")  # a torch DataLoader's default collate

    def _in_place(self, value: Any) -> bool:
        return self.device is None or self.device in value.devices()

    def _to_device(self, value: Any) -> Any:
        return jax.device_put(value if isinstance(value, (jax.Array, np.ndarray)) else np.asarray(value), self.device)

    def tensor_to_numpy(self, tensor: Any) -> np.ndarray:
        if state.is_key(tensor):
            return np.array(jax.random.key_data(tensor))
        array = np.array(tensor)
        return array.astype(np.float32) if array.dtype == jnp.bfloat16 else array

    def scalars_to_numpy(self, values: list[Any]) -> np.ndarray:
        return np.array([np.asarray(value, np.float64).mean() for value in jax.device_get(values)], np.float64)

    def is_tensor(self, obj: Any) -> bool:
        return isinstance(obj, jax.Array)

    def set_dist_repro_dataloader(self, dataloader: Any, *, dist: str | None, reproducible: bool) -> Any:
        return _dataloader.reproducible(dataloader) if reproducible else dataloader

    def set_sampler_epoch(self, dataloader: Any, epoch: int) -> None:
        super().set_sampler_epoch(dataloader, epoch)
        _dataloader.reseed_for_epoch(dataloader, epoch)

    # ------------------------------------------------------------------------------- state
    def _variables(self, node: Any, *filters: Any) -> dict[str, nnx.Variable]:
        """``{name: variable}`` of ``node``'s variables holding an array (all but random state by default)."""
        flat = nnx.to_flat_state(nnx.state(node, *(filters or (nnx.Not(nnx.RngState),))))
        return {dotted(path): v for path, v in flat if isinstance(v.get_raw_value(), jax.Array)}

    def model_state(self) -> dict[str, Any]:
        return {name: variable.get_raw_value() for name, variable in self._variables(self.model).items()}

    def load_model_state(self, state_: Mapping[str, Any]) -> None:
        variables = self._variables(self.model)
        prepared = loadable_model_state(state_, {name: v.get_raw_value() for name, v in variables.items()},
                                        type(self.model).__name__, as_tensor=_as_array, shape=lambda a: tuple(a.shape))
        for name, value in prepared.items():
            variables[name].set_raw_value(state.placed(value, variables[name].get_raw_value(), f"state[{name!r}]"))

    def frozen_parameter_names(self) -> frozenset[str]:
        """The ``nnx.Param`` variables outside the optimizer's ``wrt`` filter."""
        return frozenset(self._model_split().names[1]) if self.optimizers else frozenset()

    def module_classes(self) -> dict[str, tuple[str, ...]]:
        return {".".join(map(str, path)): tuple(cls.__name__ for cls in type(module).__mro__[:-1])
                for path, module in nnx.iter_modules(self.model)}

    def tensor_buffer(self, tensor: Any) -> tuple[str, tuple[int, ...], memoryview]:
        return state.tensor_buffer(tensor)

    def tensors_from_bytes(self, data: bytes) -> dict[str, Any]:
        return state.tensors_from_bytes(data)

    def _optimizer_state(self, optimizer: Any, where: str) -> Any:
        return {name: variable.get_raw_value() for name, variable in self._variables(optimizer, ...).items()}

    def _load_optimizer_state(self, optimizer: Any, state_: Any, where: str) -> None:
        variables = self._variables(optimizer, ...)
        if not isinstance(state_, Mapping) or set(state_) != set(variables):
            names = set(state_) if isinstance(state_, Mapping) else set()
            raise DriverError(
                f"{where} does not fit this nnx.Optimizer: it lacks {listed_names(sorted(set(variables) - names))} "
                f"and has {listed_names(sorted(names - set(variables)))} besides. Build the optimizer as the run that "
                "saved it did (the same optax transformation and wrt= over the same model).")
        for name, variable in variables.items():
            variable.set_raw_value(state.placed(state_[name], variable.get_raw_value(), f"{where}[{name!r}]"))

    def gradient_state(self) -> dict[str, Any]:
        grads = self._gradients()
        return {} if grads is None else dict(zip(self._model_split().names[0], grads, strict=True))

    def load_gradient_state(self, grads: Mapping[str, Any]) -> None:
        split = self._model_split()
        check_gradient_names(grads, split.names[0], type(self.model).__name__)
        self._pending = self._fused_batch = None
        if not grads:
            self._grads = None
            return
        current = split.values(0)
        self._grads = [state.placed(grads[name], value, f"load_gradient_state: grads[{name!r}]") if name in grads
                       else jnp.zeros_like(value) for name, value in zip(split.names[0], current, strict=True)]

    def seed(self, seed: int) -> None:
        """Reseed the model's ``nnx.Rngs`` streams (JAX keeps no global random state)."""
        state.reseed(self.model, seed)

    def rng_state(self) -> dict[str, Any]:
        return state.rng_state(self.model)

    def load_rng_state(self, state_: Mapping[str, Any]) -> None:
        state.load_rng_state(self.model, state_)

    def framework_version(self) -> str:
        return f"{jax.__version__} (flax {flax.__version__}, optax {optax.__version__})"

    def describe(self) -> str:
        device = self.device if self.device is not None else jax.devices()[0]
        return f"{super().describe()} device={device}"


def _same(variables: list[nnx.Variable], values: list[Any]) -> bool:
    """Whether ``variables`` still hold exactly ``values`` (nothing set them since)."""
    return all(variable.get_raw_value() is value for variable, value in zip(variables, values, strict=True))


def _as_array(value: Any, where: str) -> Any:
    if isinstance(value, (jax.Array, np.ndarray)):
        return value
    raise DriverError(f"{where} is a {type(value).__name__}; the jax driver needs jax or numpy arrays.")
