"""The single-process jittor driver (:mod:`.factory` builds it, or under ``mpirun`` the MPI one).

Every argument (model, device, precision, framework options) is validated up front, by
the factory and the constructor, so a wrong input fails when the Trainer is built.

How the contract maps onto jittor:

- forward: ``Module.execute`` (``model(...)`` calls it), with auto parameter matching;
- backward: ``optimizer.backward(loss)`` for each optimizer -- jittor's optimizers hold
  the gradients and add up successive backward calls (``loss.backward()`` does not
  exist in jittor);
- step: ``optimizer.step()`` with no loss (it steps on the accumulated gradients and
  marks them stale); an optimizer with no backward since its last step or zero_grad is
  skipped, as torch skips parameters whose gradient is None;
- zero_grad: ``optimizer.zero_grad()`` (marks the stored gradients stale);
- scalars: jittor has no 0-d Vars (a mean is shape ``[1]``). The loss the model returns,
  and the loss given to :meth:`backward`, are handed to numpy as 0-d arrays, as torch
  hands over its scalar loss; every other Var keeps its shape (one label stays ``(1,)``);
- device: the global ``jt.flags.use_cuda`` (see :mod:`._device`), set in :meth:`setup`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from drivetrain.backend import Driver, DriverError, check_framework_kwargs, check_lrs, move_nested

from . import _rng
from . import state as _state
from ._dataloader import DatasetLoader, is_jittor_dataset, replaceable, reproducible_loader
from ._device import apply_device, resolve_device
from ._import import import_jittor
from .plugin import CAPABILITIES
from .precision import AMP_OPTION, Precision

jt = import_jittor()

FRAMEWORK_KWARGS: dict[str, str] = {
    AMP_OPTION: "4, 5 or 6: jt.flags.auto_mixed_precision_level set around the training forward for "
    "precision='fp16' (a process-wide flag; required to accept fp16)",
}
_NOT_HERE = {
    "param_sync_iter": "is an argument of the jittor optimizer, not of the driver; pass it when building the optimizer.",
}


def check_model(model: Any) -> None:
    """The jittor drivers drive ``jittor.Module`` instances; anything else is refused with the driver that fits."""
    if isinstance(model, jt.Module):
        return
    if isinstance(model, type):
        raise DriverError(f"model={model!r:.80} is a class; pass an instance, e.g. {model.__name__}().")
    from drivetrain import available_drivers

    fits = [spec.name for spec in available_drivers().values() if spec.name != "jittor" and spec.claims(model)]
    kind = f"a {type(model).__module__}.{type(model).__qualname__}"
    if fits:
        raise DriverError(
            f"model={type(model).__qualname__}(...) is {kind}, not a jittor.Module: driver='jittor' drives jittor "
            f"models. Use driver={fits[0]!r} for this model (or driver='auto', which picks it)."
        )
    framework = (type(model).__module__ or "").split(".")[0]
    raise DriverError(
        f"model={model!r:.80} is {kind}, not a jittor.Module, and no installed driver claims "
        f"{framework!r} models; the jittor driver needs a jittor.Module (class MyNet(jittor.Module) with execute())."
    )


_VAR = jt.Var


def _is_numeric_array(value: Any) -> bool:
    return type(value) is np.ndarray and value.dtype.kind in "biuf"


class JittorSingleDriver(Driver):
    """Drives a ``jittor.Module`` in one process, on the CPU or one GPU."""

    name = "jittor"
    capabilities = CAPABILITIES
    default_forward_name = "execute"

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
        options = check_framework_kwargs(framework_kwargs, FRAMEWORK_KWARGS, argument="jittor_kwargs",
                                         not_here=_NOT_HERE)
        self.device: str = resolve_device(device, jt)
        self._precision = Precision(precision, self.device, options.get(AMP_OPTION), jt)
        # The last loss the model returned and the last one given to backward (they differ when the
        # core divides for accumulation): tensor_to_numpy hands them over as 0-d arrays.
        self._model_loss: Any = None
        self._backward_loss: Any = None

    # ------------------------------------------------------------------ lifecycle
    def setup(self) -> None:
        """Make the driver's device jittor's global one (``jt.flags.use_cuda``)."""
        apply_device(self.device, jt)

    # ---------------------------------------------------------------------- model
    def model_call(self, batch: Any, fn: Callable, signature_fn: Callable | None) -> Any:
        outputs = super().model_call(batch, fn, signature_fn)
        if type(outputs) is dict:
            self._model_loss = outputs.get("loss")
        return outputs

    def set_model_mode(self, mode: str) -> None:
        if mode == "train":
            self.model.train()
        elif mode == "eval":
            self.model.eval()
        else:
            raise DriverError(f"set_model_mode(mode={mode!r}) accepts 'train' or 'eval'.")

    def no_grad(self) -> contextlib.AbstractContextManager:
        return jt.no_grad()

    def auto_cast(self) -> contextlib.AbstractContextManager:
        return self._precision.autocast()

    # --------------------------------------------------------------- optimisation
    def _check_optimizer(self, optimizer: Any) -> str | None:
        if isinstance(optimizer, type):
            return ("is a class, not an optimizer; create one from the model's parameters, "
                    "e.g. jittor.optim.SGD(model.parameters(), lr=0.1).")
        if not isinstance(optimizer, jt.optim.Optimizer):
            framework = (type(optimizer).__module__ or "").split(".")[0]
            origin = f" (a {framework} object)" if framework and framework not in ("builtins", "jittor") else ""
            return (f"is not a jittor.optim.Optimizer{origin}; the jittor driver needs a jittor optimizer, "
                    "e.g. jittor.optim.Adam(model.parameters(), lr=1e-3).")
        own = {id(p) for p in self.unwrap_model().parameters()}
        params = _state.parameters_of(optimizer)
        if params and not any(id(p) in own for p in params):
            return (f"none of its {len(params)} parameter(s) belong to the model {type(self.unwrap_model()).__name__}, "
                    "so stepping it would never change the model. Build it from this model's parameters, "
                    "e.g. jittor.optim.SGD(model.parameters(), lr=0.1).")
        return None

    def set_optimizers(self, optimizers: Any) -> None:
        super().set_optimizers(optimizers)
        owner: dict[int, int] = {}
        for k, optimizer in enumerate(self.optimizers):  # jittor computes each optimizer's gradients on its own
            for param in _state.parameters_of(optimizer):
                if owner.setdefault(id(param), k) != k:
                    raise DriverError(
                        f"optimizers[{owner[id(param)]}] and optimizers[{k}] both update a parameter of shape "
                        f"{list(param.shape)}; each would add its own gradient step. Give every parameter to one "
                        "optimizer (use param groups for different settings)."
                    )

    _buffers: list[Any] | None = None
    """The model's Vars without gradients (buffers), found on the first backward; loading keeps their identity."""

    def backward(self, loss: Any) -> None:
        if not isinstance(loss, jt.Var):
            raise DriverError(
                f"the model's output 'loss' is a {type(loss).__name__} ({loss!r:.60}), not a jittor Var; "
                "return the loss Var itself (do not call .item() or float() on it)."
            )
        if loss.numel() != 1:
            raise DriverError(
                f"the model's output 'loss' has shape {list(loss.shape)}; backward needs a single number: "
                "reduce it in the model, e.g. loss.mean()."
            )
        if loss.is_stop_grad():
            raise DriverError(
                "the model's output 'loss' does not require grad (stop_grad): was it computed under jt.no_grad(), "
                "in eval mode (model.eval() stops the parameters' gradients), or detached?"
            )
        self._backward_loss = loss
        optimizers = self.optimizers
        last = len(optimizers) - 1
        for k, optimizer in enumerate(optimizers):
            optimizer.backward(loss, retain_graph=k < last)  # adds to the gradients stored in the optimizer
        # optimizer.backward computes the gradients only; the forward's buffer updates (batch-norm running
        # statistics) stay pending and jittor fuses them into whatever runs next, so a checkpoint or an
        # evaluation (which read them) changed their rounding and a resumed run differed from an unbroken
        # one. Computing them here, in every run, gives them one fixed place.
        buffers = self._buffers
        if buffers is None:
            buffers = self._buffers = [v for v in self.unwrap_model().state_dict().values() if v.is_stop_grad()]
        if buffers:
            jt.sync(buffers)

    def _clip_gradients(self) -> None:
        grads = [g for opt in self.optimizers if _state.gradients_live(opt)
                 for group in opt.param_groups
                 for p, g in zip(group["params"], group.get("grads", ()), strict=False) if not p.is_stop_grad()]
        if not grads:
            return
        if self.grad_clip_type == "value":
            for g in grads:
                g.update(jt.clamp(g, -self.grad_clip, self.grad_clip))
            return
        total = jt.norm(jt.concat([g.flatten() for g in grads]), 2)
        scale = jt.minimum(self.grad_clip / (total + 1e-6), 1.0)
        for g in grads:
            g.update(g * scale)

    def step(self) -> None:
        if self.grad_clip is not None:
            self._clip_gradients()
        for optimizer in self.optimizers:
            if _state.gradients_live(optimizer):
                optimizer.step()

    def zero_grad(self) -> None:
        for optimizer in self.optimizers:
            optimizer.zero_grad()

    def get_lrs(self) -> list[list[float]]:
        # jittor steps a group with its own "lr" when it has one, else with the optimizer's lr
        return [[float(group.get("lr", optimizer.lr)) for group in optimizer.param_groups]
                for optimizer in self.optimizers]

    def set_lrs(self, lrs: list[list[float]]) -> None:
        checked = check_lrs(lrs, [len(optimizer.param_groups) for optimizer in self.optimizers])
        for optimizer, rates in zip(self.optimizers, checked, strict=True):
            for group, lr in zip(optimizer.param_groups, rates, strict=True):
                group["lr"] = lr  # what jittor's own LRScheduler writes; it wins over optimizer.lr

    # ----------------------------------------------------------------------- data
    def move_data_to_device(self, batch: Any) -> Any:
        """Numeric numpy arrays become jittor Vars (jittor places every Var by the global device flag)."""
        if type(batch) is dict:  # the usual batch, already Vars: checked without recursion
            for value in batch.values():
                if type(value) is not _VAR:
                    break
            else:
                return batch
        return move_nested(batch, _is_numeric_array, lambda array: jt.array(array).stop_grad())

    def tensor_to_numpy(self, tensor: Any) -> np.ndarray:
        if not isinstance(tensor, jt.Var):
            return np.asarray(tensor)
        array = _state.to_numpy(tensor)  # always a host copy
        if (tensor is self._model_loss or tensor is self._backward_loss) and array.size == 1:
            return array.reshape(())
        return array

    def is_tensor(self, obj: Any) -> bool:
        return isinstance(obj, jt.Var)

    def check_dataloader_legality(self, dataloader: Any, argument: str = "train_dataloader") -> None:
        if is_jittor_dataset(dataloader):
            return
        if isinstance(dataloader, jt.Var):
            raise DriverError(
                f"{argument}=jittor.Var is one tensor, not a dataloader; wrap the data in a jittor Dataset "
                "(set_attrs(batch_size=..., shuffle=True)) or pass a list of batch dicts."
            )
        super().check_dataloader_legality(dataloader, argument)

    def set_dist_repro_dataloader(self, dataloader: Any, *, dist: str | None, reproducible: bool) -> Any:
        """A jittor Dataset read through a resumable sampler when ``reproducible`` (see :mod:`._dataloader`).

        Sharding (``dist``) belongs to the MPI driver; this single-process driver is never asked for it.
        """
        if dist not in (None, "train", "eval"):
            raise DriverError(f"set_dist_repro_dataloader(dist={dist!r}): use None, 'train' or 'eval'.")
        if dist is not None or not reproducible:
            return dataloader
        if isinstance(dataloader, DatasetLoader) or not is_jittor_dataset(dataloader) or not replaceable(dataloader):
            return dataloader
        return reproducible_loader(dataloader, num_replicas=1, rank=0, batch_size=int(dataloader.batch_size))

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
        _rng.seed_generator(seed)

    # ------------------------------------------------- training state (checkpoints)
    def _optimizer_state(self, optimizer: Any, where: str) -> Any:
        return _state.optimizer_state(self.unwrap_model(), optimizer, where)

    def _load_optimizer_state(self, optimizer: Any, state: Any, where: str) -> None:
        _state.load_optimizer_state(self.unwrap_model(), optimizer, state, where)

    def gradient_state(self) -> dict[str, Any]:
        return _state.gradient_state(self.unwrap_model(), self.optimizers)

    def load_gradient_state(self, grads: Mapping[str, Any]) -> None:
        _state.load_gradient_state(self.unwrap_model(), self.optimizers, grads)

    def rng_state(self) -> dict[str, Any]:
        return _rng.rng_state()

    def load_rng_state(self, state: Mapping[str, Any]) -> None:
        _rng.load_rng_state(state)

    def framework_version(self) -> str:
        return str(jt.__version__)

    # ----------------------------------------------------------------- describing
    def describe(self) -> str:
        return (f"jittor driver ({type(self).__name__}) device={self.device} "
                f"precision={self._precision.describe()} jittor={jt.__version__}")
