"""Which process layout ``driver="deepspeed"`` asks for, and the DeepSpeed config, checked up front.

The layout is decided as for the torch DDP driver (``sharded_plan_fields`` of :mod:`drivetrain_torch.extension`: torchrun's or the
``deepspeed`` launcher's environment, ``nproc=``/``device=[...]``, or a process group the
user initialised); one process is allowed too (ZeRO over a world of one: the run a
checkpoint of several processes resumes on, or a first test of a config). The options come
from ``deepspeed_kwargs``; the config (a dict or a JSON file) is read and checked here, so a
bad one fails before any process starts. :func:`merged_config` then fills it from the
Trainer's own arguments and refuses a contradiction between the two.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import sys
from collections.abc import Mapping
from typing import Any

import torch

from drivetrain.backend import LAUNCH_OPTION_DOCS, DriverError
from drivetrain_torch.extension import DIST_KWARGS, ShardedPlan, sharded_plan_fields

OPTIONS = "deepspeed_kwargs"
CONFIG = f"{OPTIONS}['config']"
STAGES = (1, 2, 3)
DEFAULT_STAGE = 2
AUTO = "auto"
"""A config value drivetrain fills from the Trainer's arguments (as in Hugging Face's DeepSpeed configs)."""

DEEPSPEED_KWARGS = {
    "config": "the DeepSpeed config: a dict or the path of a JSON file (zero_optimization, optimizer, scheduler, "
    "fp16/bf16, ...). Keys left out, or set to 'auto', are filled from the Trainer: precision -> fp16/bf16, "
    "grad_clip -> gradient_clipping, the train dataloader's batch_size -> train_micro_batch_size_per_gpu, "
    "accumulation_steps -> gradient_accumulation_steps; a value that contradicts the Trainer is refused",
    "zero_stage": f"1, 2 or 3 (default {DEFAULT_STAGE} unless the config says): ZeRO shards the optimizer state "
    "(1), also the gradients (2), also the parameters (3)",
    "state_dict": "'sharded' (default): each rank writes the ranges of the fp32 weights and optimizer state ZeRO gave "
    "it, nothing gathered (loads at any world size and stage, into driver='torch' or 'torch_fsdp' too; `drivetrain "
    "export` merges the weights); 'full': the full state is gathered and rank 0 writes the torch drivers' one-file "
    "format (a model whose state fits every rank's CPU memory)",
    **{name: DIST_KWARGS[name] for name in ("timeout", "backend")},
    **LAUNCH_OPTION_DOCS,
}

_DRIVETRAIN_OWNS = {
    "managed_gradient_accumulation": "the Trainer decides when a gradient-accumulation cycle ends (it calls "
    "step() then), so drivetrain sets it to false; remove it from the config",
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class DeepSpeedPlan(ShardedPlan):
    """The sharded plan plus the user's DeepSpeed config (a checked copy; ``{}`` when none was given)."""

    config: dict[str, Any]
    zero_stage: int


def plan_deepspeed(model: Any, device: Any, nproc: Any, options: Mapping[str, Any]) -> DeepSpeedPlan:
    """The layout of a ``deepspeed`` run: a launcher's, the Trainer's own processes, the user's group, or one."""
    fields = sharded_plan_fields(model, device, nproc, options, argument=OPTIONS, wraps_itself=(
        "driver='deepspeed' wraps the model in a DeepSpeed engine itself, but the model is a "
        "DistributedDataParallel; pass the bare module (model.module)."))
    _choose_accelerator(fields["device"])
    config = read_config(options.get("config"))
    return DeepSpeedPlan(**fields, config=config, zero_stage=_stage(options, config))


def _choose_accelerator(device: torch.device) -> None:
    """DeepSpeed picks its accelerator (CUDA where there is a GPU) once, when it is first imported: make it the
    CPU one for a run on the CPU, and refuse a DeepSpeed that already chose another than this run's device."""
    wanted = "cpu" if device.type == "cpu" else "cuda"
    if "deepspeed" not in sys.modules:
        if wanted == "cpu":
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
        chosen = os.environ.get("DS_ACCELERATOR", wanted)
    else:
        from deepspeed.accelerator import get_accelerator

        chosen = get_accelerator().device_name()
    if chosen != wanted:
        raise DriverError(
            f"this process trains on {device}, but DeepSpeed's accelerator is {chosen!r} (DS_ACCELERATOR, or the "
            f"first use of deepspeed in this process); set DS_ACCELERATOR={wanted} before deepspeed is imported, or "
            f"pass device= for {chosen}."
        )


# ------------------------------------------------------------------------------ config
def read_config(value: Any) -> dict[str, Any]:
    """The config as a dict: a copy of the given one, or the JSON file it names; refused with the reason."""
    if value is None:
        return {}
    if isinstance(value, (str, os.PathLike)):
        path = os.fspath(value)
        try:
            with open(path, encoding="utf-8") as f:
                value = json.load(f)
        except OSError as exc:
            raise DriverError(f"{CONFIG}={path!r} cannot be read ({exc.strerror}); give the path of a JSON "
                              "file or the config as a dict.") from None
        except json.JSONDecodeError as exc:
            raise DriverError(f"{CONFIG}={path!r} is not valid JSON ({exc}); fix the file or pass a dict.") from None
    if not isinstance(value, Mapping):
        raise DriverError(f"{CONFIG} is a {type(value).__name__}; give a dict or the path of a JSON file.")
    config = copy.deepcopy(dict(value))
    for key, why in _DRIVETRAIN_OWNS.items():
        if key in config and config[key] is not False:
            raise DriverError(f"{CONFIG}[{key!r}]={config[key]!r}: {why}.")
    zero = config.get("zero_optimization", {})
    if not isinstance(zero, Mapping):
        raise DriverError(f"{CONFIG}['zero_optimization'] is a {type(zero).__name__}; give a dict such as "
                          "{'stage': 2}.")
    return config


def _stage(options: Mapping[str, Any], config: Mapping[str, Any]) -> int:
    given = options.get("zero_stage")
    in_config = config.get("zero_optimization", {}).get("stage")
    for where, stage in ((f"{OPTIONS}['zero_stage']", given), (f"{CONFIG}['zero_optimization']['stage']", in_config)):
        if stage is not None and (isinstance(stage, bool) or stage not in STAGES):
            raise DriverError(f"{where}={stage!r}: use 1, 2 or 3 (ZeRO stage 0 is plain data parallelism: use "
                              "driver='torch' with nproc / torchrun for it).")
    if given is not None and in_config is not None and given != in_config:
        raise DriverError(
            f"{OPTIONS}['zero_stage']={given} contradicts {CONFIG}['zero_optimization']['stage']={in_config}; "
            "give the stage in one place."
        )
    return given if given is not None else in_config if in_config is not None else DEFAULT_STAGE


def merged_config(plan: DeepSpeedPlan, *, precision: str, grad_clip: float | None, grad_clip_type: str,
                  torch_optimizers: bool) -> dict[str, Any]:
    """The config DeepSpeed gets: the user's, with what the Trainer's arguments say filled in.

    A value the user wrote that contradicts the Trainer's argument is refused, naming both and the fix.
    The batch size and the accumulation steps are known later (the dataloader, the first step):
    :func:`check_batch_size` and :func:`check_accumulation` check them then.
    """
    config = copy.deepcopy(plan.config)
    _merge_precision(config, precision)
    if grad_clip is not None and grad_clip_type != "norm":
        raise DriverError(
            f"grad_clip_type={grad_clip_type!r}: DeepSpeed clips gradients by their global norm only; use "
            "grad_clip_type='norm' (the default) with driver='deepspeed'."
        )
    clip = config.get("gradient_clipping", AUTO)
    if clip == AUTO:
        config["gradient_clipping"] = 0.0 if grad_clip is None else float(grad_clip)
    elif grad_clip is not None and float(clip) != float(grad_clip):
        raise DriverError(
            f"Trainer(grad_clip={grad_clip}) contradicts {CONFIG}['gradient_clipping']={clip}; give it in one place "
            "(or set the config's value to 'auto' to take the Trainer's)."
        )
    if "optimizer" in config and torch_optimizers:
        raise DriverError(
            f"{CONFIG}['optimizer'] builds DeepSpeed's optimizer, but the Trainer was also given optimizers; pass "
            "optimizers=None to train with the config's, or remove 'optimizer' from the config to use yours."
        )
    if torch_optimizers:
        config.setdefault("zero_allow_untested_optimizer", True)  # any torch optimizer: its state is per parameter
    for key in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size"):
        if config.get(key) == AUTO:
            del config[key]
    if "train_micro_batch_size_per_gpu" not in config and "train_batch_size" not in config:
        config["train_micro_batch_size_per_gpu"] = 1  # bookkeeping only; the dataloader's batch size replaces it
    zero = dict(config.get("zero_optimization", {}))
    zero["stage"] = plan.zero_stage
    config["zero_optimization"] = zero
    config["managed_gradient_accumulation"] = False
    config.setdefault("steps_per_print", 2**62)  # drivetrain logs the run; DeepSpeed's own lines are noise
    return config


def _merge_precision(config: dict[str, Any], precision: str) -> None:
    """``fp16``/``bf16`` sections from the Trainer's precision; an explicit other one is refused."""
    said = {key: config[key].get("enabled", AUTO) for key in ("fp16", "bf16") if isinstance(config.get(key), Mapping)}
    for key, enabled in said.items():
        if enabled == AUTO:
            continue
        if bool(enabled) != (precision == key):
            state, fix = ("enables", key) if enabled else ("disables", "fp32")
            raise DriverError(
                f"Trainer(precision={precision!r}) contradicts {CONFIG}[{key!r}]['enabled']={enabled!r} (the config "
                f"{state} {key}); pass precision={fix!r} to the Trainer, or set the "
                "config's 'enabled' to 'auto' (or leave the section out) to follow the Trainer."
            )
    for key in ("fp16", "bf16"):
        section = dict(config.get(key) or {})
        section["enabled"] = precision == key
        config[key] = section


def user_batch_size(plan: DeepSpeedPlan) -> int | None:
    """The micro-batch size per process the user's config fixes, if it does."""
    config = plan.config
    micro = config.get("train_micro_batch_size_per_gpu")
    if isinstance(micro, int):
        return micro
    total, steps = config.get("train_batch_size"), config.get("gradient_accumulation_steps", 1)
    if isinstance(total, int) and isinstance(steps, int) and steps > 0:
        return total // (steps * plan.world_size)
    return None


def check_batch_size(plan: DeepSpeedPlan, batch_size: Any) -> None:
    """The Trainer's ``train_dataloader``'s batch size against the config's (when the user wrote one)."""
    fixed = user_batch_size(plan)
    if fixed is None or not isinstance(batch_size, int) or fixed == batch_size:
        return
    raise DriverError(
        f"train_dataloader's batch_size={batch_size} (per process) contradicts {CONFIG}, which makes the "
        f"micro-batch per process {fixed} (train_micro_batch_size_per_gpu, or train_batch_size / "
        "(gradient_accumulation_steps x world size)); give the same size in both, or set the config's values to "
        "'auto' (or leave them out) to take the train_dataloader's. Evaluation and prediction dataloaders may have "
        "any batch size."
    )


def check_accumulation(plan: DeepSpeedPlan, micro_batches: int, declared: bool = False) -> None:
    """The config's accumulation against the Trainer's: its ``accumulation_steps`` (``declared``, when the
    Trainer is built) or the micro-batches it accumulated before its first step."""
    steps = plan.config.get("gradient_accumulation_steps")
    if not isinstance(steps, int) or steps == micro_batches:
        return
    trainer = (f"Trainer(accumulation_steps={micro_batches})" if declared else
               f"the Trainer, which stepped after {micro_batches} micro-batch(es) (Trainer(accumulation_steps="
               f"{micro_batches}), or an epoch shorter than that)")
    raise DriverError(
        f"{CONFIG}['gradient_accumulation_steps']={steps} contradicts {trainer}; pass accumulation_steps={steps} "
        "to the Trainer, or set the config's value to 'auto' (or leave it out): drivetrain fills it from "
        "accumulation_steps."
    )
