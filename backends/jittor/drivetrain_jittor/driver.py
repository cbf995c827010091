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
  skipped, as torch skips parameters whose gradient is None. Then the model's state is
  computed in one execution, as the usual ``opt.step(loss)`` loop computes it;
- zero_grad: ``optimizer.zero_grad()`` (marks the stored gradients stale);
- scalars: jittor has no 0-d Vars (a mean is shape ``[1]``). The loss the model returns,
  and the loss given to :meth:`backward`, are handed to numpy as 0-d arrays, as torch
  hands over its scalar loss; every other Var keeps its shape (one label stays ``(1,)``);
- device: the global ``jt.flags.use_cuda`` (see :mod:`._device`), set in :meth:`setup`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from drivetrain.backend import DriverError, ModuleDriver, batch_mover

from . import _rng
from . import state as _state
from ._dataloader import reproducible_loader, shareable
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


_VAR = jt.Var


def _is_numeric_array(value: Any) -> bool:
    return type(value) is np.ndarray and value.dtype.kind in "biuf"


def _everywhere(var: Any) -> bool:
    return True  # a Var is on the device jittor's global flag names


class JittorSingleDriver(ModuleDriver):
    """Drives a ``jittor.Module`` in one process, on the CPU or one GPU."""

    name = "jittor"
    capabilities = CAPABILITIES
    default_forward_name = "execute"
    framework = jt
    module_type, module_name = jt.Module, "jittor.Module"
    optimizer_type, optimizer_name = jt.optim.Optimizer, "jittor.optim.Optimizer"
    loss_example = "jittor.nn.cross_entropy_loss(outputs, batch['label'])"
    to_tensor_example = "jittor.array(array)"
    no_grad_advice = (" (stop_grad): was it computed under jt.no_grad(), in eval mode (model.eval() stops the "
                      "parameters' gradients), or detached?")
    optimizer_example = "jittor.optim.SGD(model.parameters(), lr=0.1)"
    tensor_type = jt.Var
    dataloader_type = jt.dataset.Dataset  # a jittor Dataset is its own loader (set_attrs(batch_size=...))
    tensor_dataloader_example = "jittor.dataset.TensorDataset(x, y).set_attrs(batch_size=32, shuffle=True)"
    accepted_kwargs: Mapping[str, str] = FRAMEWORK_KWARGS
    """The ``jittor_kwargs`` keys this driver understands, with what each means."""
    not_here_kwargs = _NOT_HERE
    state_ops = _state
    rng_ops = _rng

    def resolve_device(self, device: Any, model: Any) -> str:
        return resolve_device(device, jt)

    def configure(self, options: dict[str, Any]) -> None:
        self._precision = Precision(self.precision, self.device, options.get(AMP_OPTION), jt)
        self._move = batch_mover(_VAR, _everywhere, lambda array: jt.array(array).stop_grad(), _is_numeric_array)
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

    # --------------------------------------------------------------- optimisation
    def set_optimizers(self, optimizers: Any) -> None:
        super().set_optimizers(optimizers)
        owner: dict[int, int] = {}
        for k, optimizer in enumerate(self.optimizers):  # jittor computes each optimizer's gradients on its own
            for param in self.optimizer_params(optimizer):
                if owner.setdefault(id(param), k) != k:
                    raise DriverError(
                        f"optimizers[{owner[id(param)]}] and optimizers[{k}] both update a parameter of shape "
                        f"{list(param.shape)}; each would add its own gradient step. Give every parameter to one "
                        "optimizer (use param groups for different settings)."
                    )

    def backward(self, loss: Any) -> None:
        """The template's checks and backward in one call: this runs every step."""
        if not isinstance(loss, _VAR) or loss.numel() != 1 or loss.is_stop_grad():
            self.raise_bad_loss(loss)
        self._backward_loss = loss
        optimizers = self.optimizers
        last = len(optimizers) - 1
        for k, optimizer in enumerate(optimizers):
            optimizer.backward(loss, retain_graph=k < last)  # adds to the gradients stored in the optimizer

    def clip_gradients(self, params: list[Any]) -> Any:
        """Clip the gradients the optimizers hold for ``params`` (jittor keeps them in ``group["grads"]``).

        Returns the total norm before clipping when clipping by norm, else None."""
        wanted = {id(p) for p in params}
        grads = [g for opt in self.optimizers if _state.gradients_live(opt)
                 for group in opt.param_groups
                 for p, g in zip(group["params"], group.get("grads", ()), strict=False)
                 if id(p) in wanted and not p.is_stop_grad()]
        if not grads:
            return None
        if self.grad_clip_type == "value":
            for g in grads:
                g.update(jt.clamp(g, -self.grad_clip, self.grad_clip))
            return None
        total = jt.norm(jt.concat([g.flatten() for g in grads]), 2)
        scale = jt.minimum(self.grad_clip / (total + 1e-6), 1.0)
        for g in grads:
            g.update(g * scale)
        return total

    def step(self) -> None:
        if self.grad_clip is not None:
            self.grad_norm = self.clip_gradients(self.trainable_params())
        for optimizer in self.optimizers:
            if _state.gradients_live(optimizer):
                optimizer.step()
        # The step's work (forward, backward, update and the batch-norm statistics the forwards left pending)
        # is computed here in one execution, as the next opt.step(loss) of a usual jittor loop computes it: a
        # checkpoint or an evaluation then reads finished values instead of changing how jittor fuses (and
        # rounds) them, and a resumed run matches an unbroken one.
        jt.sync(self._model_state())

    _state_vars: list[Any] | None = None

    def _model_state(self) -> list[Any]:
        """The model's parameters and buffers, found on the first step; loading keeps their identity."""
        if self._state_vars is None:
            self._state_vars = list(self.unwrap_model().state_dict().values())
        return self._state_vars

    def get_lrs(self) -> list[list[float]]:
        # jittor steps a group with its own "lr" when it has one, else with the optimizer's lr; set_lrs writes
        # group["lr"], what jittor's own LRScheduler writes, which wins over optimizer.lr
        return [[float(group.get("lr", optimizer.lr)) for group in optimizer.param_groups]
                for optimizer in self.optimizers]

    # ----------------------------------------------------------------------- data
    def move_data_to_device(self, batch: Any) -> Any:
        """Numeric numpy arrays become jittor Vars (jittor places every Var by the global device flag)."""
        return self._move(batch)

    def tensor_to_numpy(self, tensor: Any) -> np.ndarray:
        if not isinstance(tensor, jt.Var):
            return np.asarray(tensor)
        array = _state.to_numpy(tensor)  # always a host copy
        if (tensor is self._model_loss or tensor is self._backward_loss) and array.size == 1:
            return array.reshape(())
        return array

    def reproducible_dataloader(self, dataloader: Any) -> Any:
        """A jittor Dataset read through a resumable sampler (see :mod:`._dataloader`); anything else as is."""
        if not shareable(dataloader):
            return dataloader
        return reproducible_loader(dataloader, num_replicas=1, rank=0, batch_size=int(dataloader.batch_size))

    # ---------------------------------------------------------------------- state
    def seed(self, seed: int) -> None:
        _rng.seed_generator(seed)

    def gradient_state(self) -> dict[str, Any]:  # the gradients live in the optimizers
        return _state.gradient_state(self.unwrap_model(), self.optimizers)

    def load_gradient_state(self, grads: Mapping[str, Any]) -> None:
        _state.load_gradient_state(self.unwrap_model(), self.optimizers, grads)

