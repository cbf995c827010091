"""TorchFSDPDriver: ``driver="torch_fsdp"``, the model's parameters, gradients and optimizer state sharded over
the processes with torch's FSDP2 (``torch.distributed.fsdp.fully_shard``).

It starts, stops and talks to its peers exactly as :class:`~.distributed.TorchDDPDriver`
(torchrun, the Trainer's own processes, or a process group the user initialised); one
process alone starts a group of itself (a world of one). What
differs:

- at set-up, rank 0's weights are broadcast (as DDP does), then ``fully_shard`` is applied
  to each block (see ``torch_fsdp_kwargs['wrap']``) and to the root, and the optimizers,
  built by the user over the unsharded parameters, are pointed at the sharded ones;
- every call of the model goes through FSDP's hooks (a ``train_step`` method too:
  ``register_fsdp_forward_method``); accumulation turns the gradient reduce-scatter off
  (``set_requires_gradient_sync(False)``) until the cycle's last batch; clipping works
  on the sharded gradients and logs the global norm;
- evaluation and prediction gather the full parameters once (``unshard`` with resharding
  after forward off) and free them when training resumes: evaluation shards may differ
  by a batch between ranks, and a forward that all-gathers would then wait forever;
- checkpoints (``torch_fsdp_kwargs['state_dict']``): ``"sharded"`` (default) has every rank
  write its own pieces in parallel (:meth:`state_shards`, :mod:`.shards`), nothing gathered;
  such a checkpoint loads at any world size and into ``driver="torch"`` (one process or
  DDP), and theirs load here. ``"full"`` gathers the model and optimizer state into rank
  0's CPU memory in :meth:`gathering_state` (``full_state_dict=True, cpu_offload=True``)
  and rank 0 writes the torch drivers' one-file format.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method
from torch.distributed.tensor import DTensor, distribute_tensor

from drivetrain.backend import DriverError, ShardSource, StateShards, loadable_model_state

from . import shards as _shards
from ._fsdp_plan import FSDP_KWARGS, OPTIONS, FSDPPlan
from .distributed import TorchDDPDriver
from .driver import FRAMEWORK_KWARGS
from .precision import PRECISION_DTYPES
from .state import as_tensor

__all__ = ["TorchFSDPDriver"]

_BLOCK_SUFFIXES = ("Layer", "Block")
_FULL = StateDictOptions(full_state_dict=True)
_TO_RANK0 = StateDictOptions(full_state_dict=True, cpu_offload=True)


class TorchFSDPDriver(TorchDDPDriver):
    """Drives one rank of an FSDP2 run (built by ``create_fsdp_driver`` from a :class:`FSDPPlan`)."""

    name = "torch_fsdp"
    checkpoint_format = "torch"  # the torch drivers' checkpoints: loads into driver="torch" and back
    accepted_kwargs: Mapping[str, str] = {**FRAMEWORK_KWARGS, **FSDP_KWARGS}
    not_here_kwargs: Mapping[str, str] = {
        "ddp_kwargs": "configures DistributedDataParallel, which driver='torch_fsdp' does not use; remove it and "
        f"give the sharding options in {OPTIONS} (wrap, mixed_precision, activation_checkpointing, ...).",
    }
    sharding = dataclasses.replace(TorchDDPDriver.sharding, option=OPTIONS, waits="FSDP")
    plan: FSDPPlan

    def __init__(self, model: Any, plan: FSDPPlan, **options: Any) -> None:
        super().__init__(model, plan, **options)
        self._sharded = False
        self._summoned = False
        self._unsynced = False  # a backward ran without the gradient reduce-scatter since the last step
        self._gathered: tuple[dict[str, Any], list[Any]] | None = None
        self._registered: dict[str, Callable] = {}
        self._mp_policy = _mixed_precision(plan.mixed_precision, self.precision)
        self.shards_state = plan.state_dict == "sharded"

    def describe(self) -> str:
        return super().describe().replace(f" {self.name}=", " torch=")

    # ------------------------------------------------------------------ lifecycle
    def _join(self) -> None:
        """Join the process group, take rank 0's weights (or, for a model built on the meta device, create
        each rank's shards in place), shard the model, re-point the optimizers."""
        self._connect()
        module = self.model
        names = {id(p): name for name, p in module.named_parameters()}
        if _on_meta(module):
            with self._collective("sharding the meta-device model with fully_shard"):
                self._shard(module)
            module.to_empty(device=self.device)  # each rank allocates its own shards only
            self._initialise_shards(module)
        else:
            module.to(self.device)
            with self._collective("broadcasting rank 0's weights and sharding the model with fully_shard"):
                with torch.no_grad():
                    for tensor in [*module.parameters(), *module.buffers()]:
                        dist.broadcast(tensor, src=0)
                self._shard(module)
        self._sharded = True
        self._rebind_optimizers(names)

    def _initialise_shards(self, module: torch.nn.Module) -> None:
        """Fill the freshly allocated shards: the user's ``init`` callable, else every submodule's
        ``reset_parameters()``. On the CPU each rank draws from its own stream (seed + rank): DTensor's
        generator tracking covers accelerators only, and one shared stream would repeat the same rows in
        every shard."""
        init = self.plan.init
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            if self.device.type == "cpu":
                torch.manual_seed(torch.initial_seed() + self.rank)
            if init is not None:
                init(module)
                return
            for sub in module.modules():
                reset = getattr(sub, "reset_parameters", None)
                if callable(reset):
                    reset()

    def _shard(self, module: torch.nn.Module) -> None:
        """``fully_shard`` each block (children before parents), then the root."""
        from torch.distributed.device_mesh import init_device_mesh

        plan = self.plan
        mesh = init_device_mesh(self.device.type, (plan.world_size,))
        options: dict[str, Any] = {"mesh": mesh, "reshard_after_forward": plan.reshard_after_forward}
        if self._mp_policy is not None:
            options["mp_policy"] = self._mp_policy
        if plan.cpu_offload:
            from torch.distributed.fsdp import CPUOffloadPolicy

            options["offload_policy"] = CPUOffloadPolicy()
        blocks = select_blocks(module, plan.wrap)
        if plan.activation_checkpointing and not blocks:
            raise DriverError(
                f"{OPTIONS}['activation_checkpointing']=True recomputes each block's activations, but no block "
                f"was found in {type(module).__name__}; name its repeated layers in {OPTIONS}['wrap']."
            )
        for block in reversed(blocks):  # pre-order reversed: a child is sharded before its parent
            if plan.activation_checkpointing:
                from torch.distributed._composable import checkpoint

                checkpoint(block)
            fully_shard(block, **options)
        fully_shard(module, **options)

    def _rebind_optimizers(self, names: dict[int, str]) -> None:
        """The optimizers were built over the unsharded parameters: give them the sharded ones, by name."""
        current = dict(self.model.named_parameters())
        for index, optimizer in enumerate(self.optimizers):
            if optimizer.state:
                raise DriverError(
                    f"optimizers[{index}] already holds state (it has stepped), which cannot follow the parameters "
                    "into their shards; build a fresh optimizer over model.parameters() and restore a run with "
                    "resume_from / load_checkpoint instead."
                )
            for group in optimizer.param_groups:
                group["params"] = [current[names[id(p)]] if id(p) in names else p for p in group["params"]]

    # ---------------------------------------------------------------------- model
    def get_model_call_fn(self, fn_name: str | None, default: str = "train_step") -> tuple[Callable, Callable]:
        """A named method (``train_step``, ``evaluate_step``, ...) runs inside FSDP's forward hooks."""
        module = self.model
        name = fn_name if fn_name is not None else default
        method = getattr(module, name, None)
        if name == self.default_forward_name or not callable(method) or not isinstance(module, FSDPModule):
            return super(TorchDDPDriver, self).get_model_call_fn(fn_name, default)
        if name not in self._registered:
            self._registered[name] = method  # its parameters, for matching the batch: the wrapper takes *args
            register_fsdp_forward_method(module, name)
        fn, _ = super(TorchDDPDriver, self).get_model_call_fn(fn_name, default)
        return fn, self._registered[name]

    def set_model_mode(self, mode: str) -> None:
        """``eval`` gathers the full parameters until ``train`` (see the module docstring)."""
        super(TorchDDPDriver, self).set_model_mode(mode)
        if not self._sharded:
            return
        if mode == "eval":
            self._summon()
        else:
            self._release()

    def _fsdp_modules(self) -> list[FSDPModule]:
        return [m for m in self.model.modules() if isinstance(m, FSDPModule)]

    def _summon(self) -> None:
        if self._summoned:
            return
        root = self.model
        lazy_init = getattr(root._get_fsdp_state(), "_lazy_init", None)
        if lazy_init is not None:
            lazy_init()  # the root must be known before its blocks gather (evaluation may come before training)
        with self._collective("gathering the full parameters for evaluation"):
            root.set_reshard_after_forward(False)
            for module in self._fsdp_modules():
                module.unshard()
        self._summoned = True

    def _release(self) -> None:
        if not self._summoned:
            return
        for module in self._fsdp_modules():
            module.reshard()
        root = self.model
        root.set_reshard_after_forward(self.plan.reshard_after_forward)
        root.set_reshard_after_forward(False, recurse=False)  # FSDP's own default for the root
        self._summoned = False

    def no_sync(self) -> contextlib.AbstractContextManager:
        return self._no_sync() if self._sharded else contextlib.nullcontext()

    @contextlib.contextmanager
    def _no_sync(self) -> Iterator[None]:
        self._unsynced = True
        self.model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            self.model.set_requires_gradient_sync(True)

    def step(self) -> None:
        super().step()
        self._unsynced = False

    def clip_gradients(self, params: list[Any]) -> Any:
        """Clip the sharded gradients by their global norm; the norm logged is a plain tensor."""
        norm = super().clip_gradients(params)
        return norm.full_tensor() if isinstance(norm, DTensor) else norm

    def backward(self, loss: Any) -> None:
        try:
            super().backward(loss)
        except RuntimeError as exc:
            self._guard.raise_peer_failure(exc, "backward (the gradient reduce-scatter)")
            raise

    # ---------------------------------------------------------------------- state
    def state_shards(self, *, optimizers: bool) -> StateShards:
        """Every rank: its local pieces of the parameters (and optimizer state) (no communication)."""
        with self._kept_summon():
            return _shards.state_shards(self.unwrap_model(), self.optimizers if optimizers else [], self.rank)

    def load_state_shards(self, source: ShardSource, *, optimizers: bool) -> None:
        """Every rank fills its own shards from the stored chunks that overlap them (any saved world size)."""
        with self._kept_summon(), self._collective("loading a sharded checkpoint"):
            _shards.load_state_shards(self.unwrap_model(), self.optimizers, source, optimizers)

    @contextlib.contextmanager
    def gathering_state(self) -> Iterator[None]:
        """Every rank (``state_dict='full'`` saves): gather the full model and optimizer state into rank 0's
        CPU memory for the save."""
        if not self._sharded or self.shards_state:
            yield
            return
        with self._kept_summon(), self._collective("gathering the sharded model and optimizer state to rank 0"):
            model = dict(get_model_state_dict(self.model, options=_TO_RANK0))
            optimizers = [self._full_optimizer_state(opt, _TO_RANK0) for opt in self.optimizers]
        self._gathered = (model, optimizers)
        try:
            yield
        finally:
            self._gathered = None

    @contextlib.contextmanager
    def _kept_summon(self) -> Iterator[None]:
        """FSDP reshards before reading the state; gather again afterwards if evaluation had gathered."""
        summoned = self._summoned
        self._release()
        try:
            yield
        finally:
            if summoned:
                self._summon()

    def model_state(self) -> dict[str, Any]:
        """Full tensors: rank 0's gathered copy inside :meth:`gathering_state`, else gathered on every rank now
        (a collective: every rank must call it)."""
        if self._gathered is not None:
            return self._gathered[0]
        if not self._sharded:
            return super().model_state()
        with self._kept_summon(), self._collective("gathering the full model state"):
            return dict(get_model_state_dict(self.model, options=_FULL))

    def load_model_state(self, state: Mapping[str, Any]) -> None:
        """Every rank gets the full state (each read the file) and keeps its own shard of it."""
        if not self._sharded:
            super().load_model_state(state)
            return
        with self._kept_summon():  # reading state_dict() reshards: nothing is gathered while it runs
            tensors = loadable_model_state(state, self.model.state_dict(), type(self.model).__name__,
                                           as_tensor=as_tensor, shape=lambda t: tuple(t.shape))
            with self._collective("loading the model state into the shards"):
                set_model_state_dict(self.model, tensors, options=_FULL)

    def optimizer_states(self) -> list[Any]:
        if self._gathered is not None:
            return self._gathered[1]
        if not self._sharded:
            return super().optimizer_states()
        with self._collective("gathering the full optimizer state"):
            return [self._full_optimizer_state(opt, _FULL) for opt in self.optimizers]

    def _full_optimizer_state(self, optimizer: torch.optim.Optimizer, options: StateDictOptions) -> dict[str, Any]:
        """The optimizer's full state keyed by parameter index, as ``optimizer.state_dict()`` of one process is."""
        if not optimizer.state:  # nothing to gather (and DCP would take a zero-learning-rate step to create it)
            return optimizer.state_dict()
        by_name = get_optimizer_state_dict(self.model, optimizer, options=options)
        if not by_name:
            return {}  # not rank 0 with cpu_offload: rank 0 alone holds it
        order = [name for group in by_name["param_groups"] for name in group["params"]]
        index = {name: i for i, name in enumerate(order)}
        return {"state": {index[name]: value for name, value in by_name["state"].items()},
                "param_groups": [{**group, "params": [index[n] for n in group["params"]]}
                                 for group in by_name["param_groups"]]}

    def _load_optimizer_state(self, optimizer: Any, state: Any, where: str) -> None:
        if not self._sharded:
            super()._load_optimizer_state(optimizer, state, where)
            return
        prepared = self.state_ops.optimizer_state_for_load(state, where)
        if not prepared.get("state"):
            super()._load_optimizer_state(optimizer, state, where)
            return
        names = {id(p): name for name, p in self.model.named_parameters()}
        order = [names[id(p)] for group in optimizer.param_groups for p in group["params"]]
        try:
            by_name = {"state": {order[i]: value for i, value in prepared["state"].items()},
                       "param_groups": [{**group, "params": [order[i] for i in group["params"]]}
                                        for group in prepared["param_groups"]]}
            with self._collective("loading the optimizer state into the shards"):
                set_optimizer_state_dict(self.model, optimizer, by_name, options=_FULL)
        except (IndexError, KeyError, ValueError) as exc:
            raise DriverError(
                f"load_optimizer_states: {where} does not fit this optimizer ({type(exc).__name__}: {exc}); build "
                "the optimizers over the same parameters, in the same groups, as the run that saved the checkpoint."
            ) from exc

    def gradient_state(self) -> dict[str, Any]:
        """Gradients between accumulation cycles are None; inside one they are not saved yet (refused)."""
        if not self._sharded:
            return super().gradient_state()
        if self._unsynced:
            raise DriverError(
                "driver='torch_fsdp' cannot yet checkpoint inside a gradient-accumulation cycle (FSDP holds the "
                "unreduced gradients itself); save when a cycle ends, e.g. every N batches with N a multiple of "
                "accumulation_steps."
            )
        grads = {}
        for name, param in self.model.named_parameters():
            if param.grad is not None:
                grad = param.grad
                grads[name] = (grad.full_tensor() if isinstance(grad, DTensor) else grad).to("cpu", copy=True)
        return grads

    def load_gradient_state(self, grads: Mapping[str, Any]) -> None:
        if not self._sharded:
            super().load_gradient_state(grads)
            return
        params = dict(self.model.named_parameters())
        for name, param in params.items():
            value = grads.get(name)
            if value is None:
                param.grad = None
                continue
            full = as_tensor(value, f"gradients[{name!r}]").to(device=param.device, dtype=param.dtype)
            # every rank holds the full gradient: each keeps its own shard, no communication
            param.grad = distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None)


def _on_meta(module: torch.nn.Module) -> bool:
    """Whether the model was built on the meta device (``with torch.device("meta"): model = Net()``)."""
    tensors = [*module.parameters(), *module.buffers()]
    return bool(tensors) and all(t.is_meta for t in tensors)


def select_blocks(module: torch.nn.Module, wrap: Any) -> list[torch.nn.Module]:
    """The submodules to shard as blocks, in pre-order: ``wrap``'s choice, else the default rule."""
    named = [(name, m) for name, m in module.named_modules() if m is not module]
    if callable(wrap) and not isinstance(wrap, (tuple, list)):
        return [m for name, m in named if wrap(name, m)]
    if wrap is not None:
        return [m for _, m in named if type(m) in wrap or type(m).__name__ in wrap]
    in_lists = {id(child) for m in module.modules() if isinstance(m, torch.nn.ModuleList) for child in m}
    return [m for _, m in named if (id(m) in in_lists and any(True for _ in m.parameters()))
            or type(m).__name__.endswith(_BLOCK_SUFFIXES)]


def _mixed_precision(option: Any, precision: str) -> MixedPrecisionPolicy | None:
    """The option's policy, else the Trainer's precision as parameter dtype; gradients always reduced in fp32."""
    if isinstance(option, MixedPrecisionPolicy):
        return option
    dtype = PRECISION_DTYPES.get(option if option is not None else precision)
    return None if dtype is None else MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
