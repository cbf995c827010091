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

from drivetrain.backend import (
    DriverError,
    ShardSource,
    StateShards,
    gradient_copies,
    loadable_model_state,
    optimizer_state_by_index,
    optimizer_state_by_name,
)

from . import shards as _shards
from ._fsdp_plan import FSDP_KWARGS, OPTIONS, FSDPPlan
from .distributed import TorchDDPDriver
from .driver import FRAMEWORK_KWARGS
from .precision import PRECISION_DTYPES
from .sharded_engine import ShardedEngineDriver
from .state import as_tensor

__all__ = ["TorchFSDPDriver"]

_BLOCK_SUFFIXES = ("Layer", "Block")
_FULL = StateDictOptions(full_state_dict=True)
_TO_RANK0 = StateDictOptions(full_state_dict=True, cpu_offload=True)


class TorchFSDPDriver(ShardedEngineDriver, engine="FSDP", option=OPTIONS,
                      instead_of_ddp=f"give the sharding options in {OPTIONS} (wrap, mixed_precision, "
                      "activation_checkpointing, ...)"):
    """Drives one rank of an FSDP2 run (built by ``create_fsdp_driver`` from a :class:`FSDPPlan`)."""

    name = "torch_fsdp"
    gradients_held = "FSDP holds the unreduced gradients itself"
    accepted_kwargs: Mapping[str, str] = {**FRAMEWORK_KWARGS, **FSDP_KWARGS}
    plan: FSDPPlan

    def __init__(self, model: Any, plan: FSDPPlan, **options: Any) -> None:
        super().__init__(model, plan, **options)
        self._sharded = False
        self._unsynced = False  # a backward ran without the gradient reduce-scatter since the last step
        self._registered: dict[str, Callable] = {}
        self._mp_policy = _mixed_precision(plan.mixed_precision, self.precision)

    # ------------------------------------------------------------------ lifecycle
    def _join(self) -> None:
        """Join the process group, take rank 0's weights (or, for a model built on the meta device, create
        each rank's shards in place), shard the model, re-point the optimizers."""
        self._connect()
        module = self.model
        names = {id(p): name for name, p in module.named_parameters()}
        if not isinstance(module, FSDPModule):  # one sharded already (an earlier Trainer's driver, the user) stays
            self._distribute(module)
        self._sharded = True
        self._rebind_optimizers(names)

    def _distribute(self, module: torch.nn.Module) -> None:
        """Rank 0's weights sharded over the ranks, or a meta-device model's shards created on each rank."""
        if _on_meta(module):
            with self._collective("sharding the meta-device model with fully_shard"):
                self._shard(module)
            module.to_empty(device=self.device)  # each rank allocates its own shards only
            self._initialise_shards(module)
            return
        module.to(self.device)
        with self._collective("broadcasting rank 0's weights and sharding the model with fully_shard"):
            with torch.no_grad():
                for tensor in [*module.parameters(), *module.buffers()]:
                    dist.broadcast(tensor, src=0)
            self._shard(module)

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

    def _engine_started(self) -> bool:
        return self._sharded

    def _fsdp_modules(self) -> list[FSDPModule]:
        return [m for m in self.model.modules() if isinstance(m, FSDPModule)]

    def _gather_parameters(self) -> None:
        root = self.model
        lazy_init = getattr(root._get_fsdp_state(), "_lazy_init", None)
        if lazy_init is not None:
            lazy_init()  # the root must be known before its blocks gather (evaluation may come before training)
        with self._collective("gathering the full parameters for evaluation"):
            root.set_reshard_after_forward(False)
            for module in self._fsdp_modules():
                module.unshard()

    def _release_parameters(self) -> None:
        for module in self._fsdp_modules():
            module.reshard()
        root = self.model
        root.set_reshard_after_forward(self.plan.reshard_after_forward)
        root.set_reshard_after_forward(False, recurse=False)  # FSDP's own default for the root

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
        with self._peer_failures("backward (the gradient reduce-scatter)"):
            super(TorchDDPDriver, self).backward(loss)

    # ---------------------------------------------------------------------- state
    def state_shards(self, *, optimizers: bool) -> StateShards:
        """Every rank: its local pieces of the parameters (and optimizer state) (no communication)."""
        with self._kept_summon():
            return _shards.state_shards(self.unwrap_model(), self.optimizers if optimizers else [], self.rank)

    def load_state_shards(self, source: ShardSource, *, optimizers: bool) -> None:
        """Every rank fills its own shards from the stored chunks that overlap them (any saved world size)."""
        with self._kept_summon(), self._collective("loading a sharded checkpoint"):
            _shards.load_state_shards(self.unwrap_model(), self.optimizers, source, optimizers)

    def _gather_full_state(self) -> tuple[dict[str, Any], list[Any]]:
        """Into rank 0's CPU memory (``full_state_dict=True, cpu_offload=True``)."""
        with self._collective("gathering the sharded model and optimizer state to rank 0"):
            model = dict(get_model_state_dict(self.model, options=_TO_RANK0))
            return model, [self._full_optimizer_state(opt, _TO_RANK0) for opt in self.optimizers]

    def _full_model_state(self) -> dict[str, Any]:
        return dict(get_model_state_dict(self.model, options=_FULL))

    def _load_full_model_state(self, state: Mapping[str, Any]) -> None:
        tensors = loadable_model_state(state, self.model.state_dict(), type(self.model).__name__,
                                       as_tensor=as_tensor, shape=lambda t: tuple(t.shape))
        with self._collective("loading the model state into the shards"):
            set_model_state_dict(self.model, tensors, options=_FULL)

    def _full_optimizer_states(self) -> list[Any]:
        return [self._full_optimizer_state(opt, _FULL) for opt in self.optimizers]

    def _full_optimizer_state(self, optimizer: torch.optim.Optimizer, options: StateDictOptions) -> dict[str, Any]:
        """The optimizer's full state keyed by parameter index, as ``optimizer.state_dict()`` of one process is."""
        if not optimizer.state:  # nothing to gather (and DCP would take a zero-learning-rate step to create it)
            return optimizer.state_dict()
        by_name = get_optimizer_state_dict(self.model, optimizer, options=options)
        return optimizer_state_by_index(by_name) if by_name else {}  # {}: rank 0 alone holds it

    def _loads_full_state(self, prepared: Mapping[str, Any]) -> bool:
        return bool(prepared.get("state"))  # an optimizer saved before its first step loads as torch's

    def _load_full_optimizer_state(self, optimizer: Any, prepared: Mapping[str, Any], where: str) -> None:
        names = {id(p): name for name, p in self.model.named_parameters()}
        order = [names[id(p)] for group in optimizer.param_groups for p in group["params"]]
        by_name = optimizer_state_by_name(prepared, order)
        with self._collective("loading the optimizer state into the shards"):
            set_optimizer_state_dict(self.model, optimizer, by_name, options=_FULL)

    def _accumulating(self) -> bool:
        return self._unsynced

    def _engine_gradients(self) -> dict[str, Any]:
        return gradient_copies(self.model.named_parameters(), _whole_on_host)

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


def _whole_on_host(grad: torch.Tensor) -> torch.Tensor:
    """A CPU copy of the whole gradient (a sharded one gathered: every rank calls it)."""
    return (grad.full_tensor() if isinstance(grad, DTensor) else grad).to("cpu", copy=True)


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
