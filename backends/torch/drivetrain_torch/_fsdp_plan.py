"""Which process layout ``driver="torch_fsdp"`` asks for, and its sharding options, checked up front.

The layout is decided as for the DDP driver (:mod:`._dist_plan`: torchrun's environment,
``nproc=``/``device=[...]``, or a process group the user initialised); one process is allowed
too: a world of one, whose group the driver starts itself (``launch="single"``),
for ``cpu_offload`` or a meta-device model on one GPU, a first run of a multi-GPU script, or a
checkpoint of several processes resumed on one. The options come from ``torch_fsdp_kwargs`` and
are checked here, when the Trainer is built, so a bad one fails before any process starts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import torch

from drivetrain.backend import LAUNCH_OPTION_DOCS, DriverError, bool_option

from ._dist_plan import DIST_KWARGS, ShardedPlan, sharded_plan_fields

OPTIONS = "torch_fsdp_kwargs"
PRECISIONS = ("bf16", "fp16", "fp32")

FSDP_KWARGS = {
    "wrap": "which submodules fully_shard makes blocks of (each gathers its parameters only around its own "
    "forward/backward): a list of class names or classes, or a callable(name, module) -> bool; default: "
    "transformer-like blocks (items of an nn.ModuleList, classes whose names end in 'Layer' or 'Block'), "
    "else the whole model as one block",
    "mixed_precision": "'bf16', 'fp16' or 'fp32': the dtype of the gathered parameters in forward/backward, "
    "gradients reduced in fp32 (default: the Trainer's precision); or a "
    "torch.distributed.fsdp.MixedPrecisionPolicy",
    "cpu_offload": "bool (default False): keep the sharded parameters, gradients and optimizer state in CPU "
    "memory (CPUOffloadPolicy); the model must be on a GPU",
    "activation_checkpointing": "bool (default False): recompute each block's activations in backward instead "
    "of keeping them (needs blocks: see 'wrap')",
    "reshard_after_forward": "bool (default True): free each block's gathered parameters after its forward "
    "(gathered again in backward); False keeps them, trading memory for one all-gather less",
    "init": "callable(module) that fills the parameters and buffers of a model built on the meta device "
    "(with torch.device('meta'): model = Net()), after each rank has allocated only its own shards (default: "
    "every submodule's reset_parameters()); load pretrained weights afterwards with trainer.load_model(path), "
    "which reads each rank's slices only",
    "state_dict": "'sharded' (default): each rank writes its own pieces of the model and optimizer state to a "
    "checkpoint in parallel, nothing gathered (loads at any world size, into driver='torch' too; `drivetrain "
    "export` merges the weights); 'full': gather everything to rank 0, which writes the torch drivers' one-file "
    "format (a model that fits rank 0's memory)",
    **{name: DIST_KWARGS[name] for name in ("timeout", "backend")},
    **LAUNCH_OPTION_DOCS,
}

WrapPolicy = Callable[[str, torch.nn.Module], bool]


@dataclasses.dataclass(frozen=True, kw_only=True)
class FSDPPlan(ShardedPlan):
    """The sharded plan plus FSDP's options (``wrap`` is None for the default block rule)."""

    wrap: tuple[Any, ...] | WrapPolicy | None = None
    mixed_precision: Any = None
    cpu_offload: bool = False
    activation_checkpointing: bool = False
    reshard_after_forward: bool = True
    init: Callable[[torch.nn.Module], None] | None = None


def plan_fsdp(model: Any, device: Any, nproc: Any, options: Mapping[str, Any]) -> FSDPPlan:
    """The layout of a ``torch_fsdp`` run: a launcher's, the Trainer's own processes, the user's group, or one."""
    fields = sharded_plan_fields(model, device, nproc, options, argument=OPTIONS, wraps_itself=(
        "driver='torch_fsdp' shards the model itself, but the model is a DistributedDataParallel; pass the "
        "bare module (model.module), or use driver='torch' to train with your DDP wrapper."))
    offload = bool_option(options, "cpu_offload", False, argument=OPTIONS)
    if offload and fields["device"].type != "cuda":
        raise DriverError(
            f"{OPTIONS}['cpu_offload']=True moves the shards from the GPU to CPU memory, but this process trains on "
            f"{fields['device']}; remove it (on the CPU the shards already are in CPU memory), or train on GPUs."
        )
    return FSDPPlan(
        **fields, wrap=_wrap_option(options.get("wrap"), model),
        mixed_precision=_precision_option(options.get("mixed_precision")), cpu_offload=offload,
        activation_checkpointing=bool_option(options, "activation_checkpointing", False, argument=OPTIONS),
        reshard_after_forward=bool_option(options, "reshard_after_forward", True, argument=OPTIONS),
        init=_init_option(options.get("init")),
    )


def _init_option(init: Any) -> Callable[[torch.nn.Module], None] | None:
    if init is None or callable(init):
        return init
    raise DriverError(
        f"{OPTIONS}['init']={init!r}: give a callable(module) that initialises the meta-device model's "
        "parameters in place (e.g. lambda m: m.apply(my_init)), or leave it out to call reset_parameters(); "
        "load pretrained weights with trainer.load_model(path) after building the Trainer."
    )


# ----------------------------------------------------------------------------- options
def _wrap_option(wrap: Any, model: torch.nn.Module) -> tuple[Any, ...] | WrapPolicy | None:
    """``wrap`` checked: None, a callable, or class names / classes each naming a submodule of ``model``."""
    if wrap is None or callable(wrap) and not isinstance(wrap, type):
        return wrap
    items = (wrap,) if isinstance(wrap, (str, type)) else wrap
    if not isinstance(items, (list, tuple)) or not all(isinstance(i, (str, type)) for i in items):
        raise DriverError(
            f"{OPTIONS}['wrap']={wrap!r}: give a list of module class names (e.g. ['DecoderLayer']) or classes, "
            "or a callable(name, module) -> bool."
        )
    present = {type(m).__name__ for m in model.modules()}
    absent = [i for i in items if (i if isinstance(i, str) else i.__name__) not in present]
    if absent:
        raise DriverError(
            f"{OPTIONS}['wrap'] names {absent}, but the model has no submodule of that class; its classes are "
            f"{sorted(present)}. List the classes of its repeated blocks (e.g. the decoder layer)."
        )
    return tuple(items)


def _precision_option(value: Any) -> Any:
    if value is None or value in PRECISIONS:
        return value
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if isinstance(value, MixedPrecisionPolicy):
        return value
    raise DriverError(
        f"{OPTIONS}['mixed_precision']={value!r}: use 'bf16', 'fp16' or 'fp32' (parameters in that dtype, "
        "gradients reduced in fp32), a torch.distributed.fsdp.MixedPrecisionPolicy, or leave it out to follow "
        "the Trainer's precision."
    )
