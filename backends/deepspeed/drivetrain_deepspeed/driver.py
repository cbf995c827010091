"""TorchDeepSpeedDriver: ``driver="deepspeed"``, the model trained by a DeepSpeed ZeRO engine (stages 1-3).

It starts, stops and talks to its peers exactly as drivetrain-torch's ``TorchDDPDriver`` (its
subclass, through :mod:`drivetrain_torch.extension`)
(torchrun or the ``deepspeed`` launcher, the Trainer's own processes, or a process group
the user initialised; one process is a world of one); what differs:

- at set-up, rank 0's weights are broadcast, then ``deepspeed.initialize`` builds the engine
  from the config :func:`._plan.merged_config` made (the user's, filled from the
  Trainer's arguments), with the user's torch optimizer or the config's;
- the Trainer owns gradient accumulation: DeepSpeed runs with
  ``managed_gradient_accumulation=false``, so ``engine.backward`` only accumulates (the loss
  arrives already divided by the cycle's size: ``scale_wrt_gas=False``) and every
  ``engine.step()`` the Trainer makes at a cycle's end reduces, clips and steps; the first
  step checks the cycle against the config's ``gradient_accumulation_steps``;
- precision is DeepSpeed's (fp16/bf16 weights, fp32 master copy in the optimizer): no
  autocast; floating-point batches are cast to the engine's dtype;
- evaluation and prediction under ZeRO-3 gather the full parameters once (``eval``) and
  release them when training resumes: ranks may evaluate different numbers of batches, and
  a forward that gathers would then wait forever;
- checkpoints are the torch drivers' (safetensors + JSON, nothing unpickled), sharded by
  default: each rank writes the ranges of the fp32 weights and optimizer state ZeRO gave it
  (:mod:`._shards`), nothing gathered. With ``state_dict="full"`` every rank joins
  :meth:`gathering_state`, which assembles the full state (:mod:`._state`), and
  rank 0 writes it. Both kinds load at any stage and world size, in ``driver="torch"`` and
  ``"torch_fsdp"``, and theirs load here.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist

from drivetrain.backend import DriverError, ShardSource, StateShards, loadable_model_state, move_nested
from drivetrain_torch.extension import (
    PRECISION_DTYPES,
    ShardedEngineDriver,
    TorchDDPDriver,
    as_tensor,
    call_through_wrapper,
    move_to_device,
)

from . import _shards as _dss
from . import _state as _ds
from ._plan import (
    CONFIG,
    DEEPSPEED_KWARGS,
    OPTIONS,
    DeepSpeedPlan,
    check_accumulation,
    check_batch_size,
)
from ._plan import merged_config as _merged_config
from .plugin import CAPABILITIES

__all__ = ["TorchDeepSpeedDriver"]


class _ConfigOptimizer:
    """Stands for the optimizer the DeepSpeed config builds, until :meth:`TorchDeepSpeedDriver.setup` builds it."""

    param_groups: list[dict[str, Any]] = []

    def __repr__(self) -> str:
        return f"<the optimizer of {CONFIG}['optimizer'], built when the engine starts>"


class TorchDeepSpeedDriver(ShardedEngineDriver, engine="DeepSpeed", option=OPTIONS,
                           instead_of_ddp=f"put DeepSpeed's options in {CONFIG}"):
    """Drives one rank of a DeepSpeed ZeRO run (built by :data:`.factory.create_driver` from a :class:`DeepSpeedPlan`)."""

    name = "deepspeed"
    capabilities = CAPABILITIES
    gradients_held = "ZeRO holds the partly reduced gradients in its own buffers"
    full_state_errors = (IndexError, KeyError, ValueError, RuntimeError)
    reads_state_shards = True  # any stage reads only the ranges it owns
    accepted_kwargs: Mapping[str, str] = DEEPSPEED_KWARGS
    not_here_kwargs: Mapping[str, str] = {
        "grad_scaler_kwargs": "configures torch's GradScaler; DeepSpeed scales fp16 losses itself: put "
        f"initial_scale_power, loss_scale_window, ... in {CONFIG}['fp16'].",
    }
    plan: DeepSpeedPlan

    def __init__(self, model: Any, plan: DeepSpeedPlan, **options: Any) -> None:
        super().__init__(model, plan, **options)
        self.engine: Any = None
        self.config: dict[str, Any] = {}
        self._from_config = "optimizer" in plan.config
        self._order: list[list[str]] = []
        self._dtypes: dict[str, torch.dtype] = {}
        self._eval_params: contextlib.ExitStack | None = None  # the ZeRO-3 parameters gathered for evaluation
        self._micro_batches = 0  # backward calls since the last step
        self._checked_cycle = False
        self._train_batch_size: int | None = None  # the train dataloader's (configure_loop), for the engine
        self._cast = PRECISION_DTYPES.get(self.precision)
        self._check_precision()

    def configure(self, options: dict[str, Any]) -> None:
        """No autocast and no GradScaler: DeepSpeed runs the model in its precision and scales fp16 losses."""
        self.non_blocking = self.device.type == "cuda"
        self.set_to_none = True
        self._precision = None
        self.grad_scaler = None

    def _check_precision(self) -> None:
        from deepspeed.accelerator import get_accelerator

        accelerator = get_accelerator()
        supported = {"fp16": accelerator.is_fp16_supported(), "bf16": accelerator.is_bf16_supported()}
        if not supported.get(self.precision, True):
            other = "bf16" if self.precision == "fp16" and supported["bf16"] else "fp32"
            raise DriverError(
                f"precision={self.precision!r}: DeepSpeed's {accelerator.device_name()} accelerator does not support "
                f"{self.precision}; use precision={other!r}, or train on GPUs."
            )

    def describe(self) -> str:
        import deepspeed

        return f"{super().describe()} deepspeed={deepspeed.__version__} zero_stage={self.plan.zero_stage}"

    # --------------------------------------------------------------- optimisation
    def set_optimizers(self, optimizers: Any) -> None:
        """The user's torch optimizers, or (``optimizers=None``) the one the config's ``optimizer`` builds."""
        if optimizers is None and self._from_config:
            self.optimizers = [_ConfigOptimizer()]
            return
        super().set_optimizers(optimizers)
        if len(self.optimizers) > 1:
            raise DriverError(
                f"driver='deepspeed' steps one optimizer, but {len(self.optimizers)} were given; put every parameter "
                "group in one torch optimizer (param groups may differ in learning rate)."
            )
        self.config = self._merged()  # refuses a contradiction now, when the Trainer is built

    def configure_loop(self, *, accumulation_steps: int, train_dataloader: Any = None) -> None:
        """A config whose ``gradient_accumulation_steps`` or micro-batch size contradicts the Trainer fails now,
        before any process group starts (the first step checks the cycle it sees as well: an epoch may be shorter).
        The train dataloader's batch size becomes the engine's ``train_micro_batch_size_per_gpu``; evaluation and
        prediction dataloaders never touch it, whatever their batch size."""
        check_accumulation(self.plan, accumulation_steps, declared=True)
        batch_size = getattr(train_dataloader, "batch_size", None)
        check_batch_size(self.plan, batch_size)
        if isinstance(batch_size, int) and not isinstance(batch_size, bool):
            self._train_batch_size = batch_size
            if self.engine is not None:
                self.engine.set_train_micro_batch_size(batch_size)

    def _merged(self) -> dict[str, Any]:
        torch_optimizers = bool(self.optimizers) and not isinstance(self.optimizers[0], _ConfigOptimizer)
        return _merged_config(self.plan, precision=self.precision, grad_clip=self.grad_clip,
                              grad_clip_type=self.grad_clip_type, torch_optimizers=torch_optimizers)

    def backward(self, loss: Any) -> None:
        if not isinstance(loss, torch.Tensor) or not loss.requires_grad:
            self.raise_bad_loss(loss)
        if loss.numel() != 1:
            raise self.multi_value_error(loss)
        with self._peer_failures("backward (DeepSpeed's gradient reduction)"):
            self.engine.backward(loss, scale_wrt_gas=False)  # the Trainer divided it by the cycle's size
        self._micro_batches += 1

    def step(self) -> None:
        """Reduce the accumulated gradients, clip them (``gradient_clipping``) and step: a cycle's end. With no
        backward since the last step there are no gradients, so nothing moves (as a torch optimizer skips a
        parameter whose gradient is None)."""
        if not self._micro_batches:
            return
        if not self._checked_cycle:
            check_accumulation(self.plan, self._micro_batches)
            micro = self.engine.train_micro_batch_size_per_gpu()
            self.engine.set_train_batch_size(micro * self._micro_batches * self.world_size)
            self._checked_cycle = True
        with self._peer_failures("the optimizer step (DeepSpeed's gradient reduction and update)"):
            self.engine.step()
        self._micro_batches = 0
        if self.config.get("gradient_clipping"):
            self.grad_norm = self.engine.get_global_grad_norm()

    def zero_grad(self) -> None:
        optimizer = getattr(self.engine, "optimizer", None)
        if optimizer is not None and self._micro_batches == 0:  # inside a cycle the Trainer never zeroes
            optimizer.zero_grad()

    def no_sync(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()  # accumulation never reduces before step(): see the module docstring

    # ------------------------------------------------------------------ lifecycle
    def _join(self) -> None:
        """Join the process group, take rank 0's weights, build the DeepSpeed engine."""
        import deepspeed

        self._connect()
        module = self.model
        module.to(self.device)
        names = {id(p): name for name, p in module.named_parameters()}
        self._dtypes = {name: p.dtype for name, p in module.named_parameters(remove_duplicate=False)}
        optimizer = None if self._from_config else (self.optimizers[0] if self.optimizers else None)
        if optimizer is not None:
            self._order = [[names[id(p)] for p in group["params"]] for group in optimizer.param_groups]
        if not self.config:
            self.config = self._merged()
        os.environ.setdefault("LOCAL_RANK", str(self.plan.local_rank))  # DeepSpeed asserts it is set
        with self._collective("broadcasting rank 0's weights and starting the DeepSpeed engine"):
            with torch.no_grad():
                for tensor in [*module.parameters(), *module.buffers()]:
                    dist.broadcast(tensor, src=0)
            if optimizer is None and not self._from_config and self.plan.zero_stage < 3:
                # nothing to train (an Evaluator): ZeRO-1/2 shard only the training state, so the module serves as is
                if self._cast is not None:
                    module.to(self._cast)  # the dtype the engine would have given it
                return
            self.engine, built, _, _ = deepspeed.initialize(model=module, optimizer=optimizer, config=self.config,
                                                            dist_init_required=False)
        if self._train_batch_size is not None:
            self.engine.set_train_micro_batch_size(self._train_batch_size)
        if self.engine.optimizer is not None:
            base = _ds.base_optimizer(self.engine)
            self.optimizers = [base]
            if not self._order:  # the config's optimizer: built over every trainable parameter, in order
                self._order = [[name for name, p in module.named_parameters() if p.requires_grad]]

    # ---------------------------------------------------------------------- model
    def get_model_call_fn(self, fn_name: str | None, default: str = "train_step") -> tuple[Callable, Callable]:
        """Training through the engine's forward (or the named method, whose submodules gather under ZeRO-3)."""
        fn, signature = super(TorchDDPDriver, self).get_model_call_fn(fn_name, default)
        if default != "train_step" or self.engine is None:
            return fn, signature
        engine, method = self.engine, None if fn is self.model else fn.__name__

        def call(*args: Any, **kwargs: Any) -> Any:
            with self._peer_failures("the training forward through the DeepSpeed engine"):
                return (engine(*args, **kwargs) if method is None
                        else call_through_wrapper(engine, engine.module, method, args, kwargs))

        return call, signature

    def _engine_started(self) -> bool:
        return self.engine is not None

    def _gather_parameters(self) -> None:
        """ZeRO-3's parameters, whole (ZeRO-1/2 keep them whole already)."""
        if self.plan.zero_stage == 3:
            stack = contextlib.ExitStack()
            with self._collective("gathering the ZeRO-3 parameters for evaluation"):
                stack.enter_context(_ds.gathered(list(self.model.parameters())))
            self._eval_params = stack

    def _release_parameters(self) -> None:
        stack, self._eval_params = self._eval_params, None
        if stack is not None:
            with self._collective("releasing the gathered ZeRO-3 parameters"):
                stack.close()

    def move_data_to_device(self, batch: Any) -> Any:
        """Floating-point tensors in the engine's dtype too (its weights are in it)."""
        moved = move_to_device(batch, self.device, self.non_blocking)
        cast = self._cast
        if cast is None:
            return moved
        return move_nested(moved, _is_float_tensor, lambda tensor: tensor.to(cast))

    # ---------------------------------------------------------------------- state
    def state_shards(self, *, optimizers: bool) -> StateShards:
        """Every rank: its own ranges of the weights (and optimizer state), nothing gathered."""
        if self.engine is None:
            return super().state_shards(optimizers=optimizers)
        with self._kept_summon(), self._collective("writing the ZeRO partitions"):
            order = self._order if optimizers and self._has_optimizer() else []
            return _dss.state_shards(self.engine, self._dtypes, order, self.rank)

    def load_state_shards(self, source: ShardSource, *, optimizers: bool) -> None:
        """Every rank: its own ranges (and ZeRO-1/2's whole model copy) from any sharded layout."""
        if self.engine is None:
            super().load_state_shards(source, optimizers=optimizers)
            return
        with self._kept_summon(), self._collective("loading a sharded checkpoint"):
            _dss.load_state_shards(self.engine, source, optimizers, self._order if self._has_optimizer() else [])

    def _gather_full_state(self) -> tuple[dict[str, Any], list[Any]]:
        """Assembled on every rank; rank 0 keeps it for the save."""
        with self._collective("gathering the ZeRO model and optimizer state"):
            model = _ds.full_model_state(self.model, self._dtypes)
            optimizers = self._full_optimizer_states()
        return (model, optimizers) if self.is_global_zero else ({}, [{}] * len(optimizers))

    def _has_optimizer(self) -> bool:
        return self.engine is not None and self.engine.optimizer is not None and bool(self._order)

    def _full_model_state(self) -> dict[str, Any]:
        return _ds.full_model_state(self.model, self._dtypes)

    def _load_full_model_state(self, state: Mapping[str, Any]) -> None:
        expected = {name: torch.empty(0) for name in self._dtypes}
        expected.update({name: b for name, b in self.model.named_buffers()})
        tensors = loadable_model_state(state, expected, type(self.model).__name__, as_tensor=as_tensor,
                                       shape=lambda t: None)
        self._check_shapes(tensors)
        _ds.load_full_model_state(self.model, tensors)

    def _check_shapes(self, tensors: Mapping[str, torch.Tensor]) -> None:
        for name, param in self.model.named_parameters(remove_duplicate=False):
            shape = tuple(getattr(param, "ds_shape", param.shape))
            if tuple(tensors[name].shape) != shape:
                raise DriverError(
                    f"load_model_state: {name!r} has shape {tuple(tensors[name].shape)} in the state but {shape} in "
                    f"the model {type(self.model).__name__}; load a checkpoint of the same model."
                )

    def _full_optimizer_states(self) -> list[Any]:
        return [_ds.full_optimizer_state(self.engine, self._order)] if self._has_optimizer() else []

    def _load_full_optimizer_state(self, optimizer: Any, prepared: Mapping[str, Any], where: str) -> None:
        _ds.load_full_optimizer_state(self.engine, self._order, prepared, where)

    def _accumulating(self) -> bool:
        return bool(self._micro_batches)

    def _engine_gradients(self) -> dict[str, Any]:
        return {}  # between accumulation cycles ZeRO holds no gradients

    def load_gradient_state(self, grads: Mapping[str, Any]) -> None:
        if grads:
            raise DriverError(
                "this checkpoint was taken inside a gradient-accumulation cycle (it holds gradients), which "
                "driver='deepspeed' cannot resume; resume from a checkpoint taken when a cycle ended."
            )


def _is_float_tensor(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.is_floating_point()
