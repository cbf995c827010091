"""Full (unsharded) model and optimizer state of a DeepSpeed ZeRO engine, read and written by parameter name.

Reading goes through DeepSpeed's public tensor-fragment API (``safe_get_full_fp32_param``,
``safe_get_full_optimizer_state``): a collective every rank joins, after which every rank
holds the full fp32 tensors. Writing needs no communication, because every rank has read
the whole checkpoint: each rank copies its own piece. For ZeRO-1/2 that is
``safe_set_full_fp32_param`` / ``safe_set_full_optimizer_state`` plus the module's parameter
(not partitioned there); for ZeRO-3 the piece is cut here, because DeepSpeed 0.19's setter
reads the wrong slice on the last rank of a parameter whose size does not divide by the
world size (``start (18) + length (18) exceeds dimension size (35)``).

The optimizer state comes out in the shape of a torch optimizer's ``state_dict()`` of one
process (state keyed by the parameter's index in the user's param groups), so it loads into
``driver="torch"`` and back, at any world size.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from drivetrain.backend import DriverError, optimizer_state_by_index


def _zero3(param: torch.nn.Parameter) -> bool:
    return hasattr(param, "ds_id")


@contextlib.contextmanager
def gathered(params: list[torch.nn.Parameter]) -> Iterator[None]:
    """ZeRO-3 parameters gathered whole for the block (a collective); nothing to do for ZeRO-1/2."""
    sharded = [p for p in params if _zero3(p)]
    if not sharded:
        yield
        return
    import deepspeed

    with deepspeed.zero.GatheredParameters(sharded, modifier_rank=None):
        yield


# ---------------------------------------------------------------------------- model
def full_model_state(module: torch.nn.Module, dtypes: Mapping[str, torch.dtype]) -> dict[str, torch.Tensor]:
    """Every parameter (fp32 master copy where there is one) and buffer, whole, on the CPU; every rank calls it.

    ``dtypes``: the dtype each parameter had before DeepSpeed took the model (what the file records).
    """
    from deepspeed.utils import safe_get_full_fp32_param

    state: dict[str, torch.Tensor] = {}
    frozen = []
    for name, param in module.named_parameters(remove_duplicate=False):
        full = safe_get_full_fp32_param(param) if param.requires_grad else None
        if full is None:
            frozen.append((name, param))
            continue
        state[name] = full.detach().to("cpu", dtype=dtypes.get(name, full.dtype), copy=True)
    with gathered([p for _, p in frozen]):
        for name, param in frozen:
            state[name] = param.detach().to("cpu", dtype=dtypes.get(name, param.dtype), copy=True)
    for name, buffer in module.named_buffers():
        state[name] = buffer.detach().to("cpu", copy=True)
    return state


def load_full_model_state(module: torch.nn.Module, tensors: Mapping[str, torch.Tensor]) -> None:
    """Copy full tensors into the engine's module; every rank calls it with the same full tensors.

    ZeRO-3's parameters are gathered and written whole (a collective: DeepSpeed then re-partitions them, and the
    small ones it keeps whole on every rank, below ``stage3_param_persistence_threshold``, get the new values too);
    their fp32 master pieces, and ZeRO-1/2's, are cut here without communication.
    """
    from deepspeed.utils import safe_set_full_fp32_param

    named = list(module.named_parameters())
    with torch.no_grad():
        with _modifying([p for _, p in named if _zero3(p)]):
            for name, param in named:
                if _zero3(param):
                    param.data.copy_(tensors[name].to(device=param.device, dtype=param.dtype).reshape(param.ds_shape))
        for name, param in named:
            value = tensors[name].to(device=param.device)
            if _zero3(param):
                if param.requires_grad:
                    piece, _ = param._z3_optimizer._get_fp32_opt_state_partition(param, release_swap_buffers=False)
                    _fill_zero3(piece, param, value)
                continue
            param.copy_(value)
            if param.requires_grad:
                safe_set_full_fp32_param(param, value.float())
        for name, buffer in module.named_buffers():
            buffer.copy_(tensors[name])


@contextlib.contextmanager
def _modifying(params: list[torch.nn.Parameter]) -> Iterator[None]:
    """ZeRO-3 parameters gathered for writing; every rank writes the same values, rank 0's are kept."""
    if not params:
        yield
        return
    import deepspeed

    with deepspeed.zero.GatheredParameters(params, modifier_rank=0):
        yield


def _fill_zero3(piece: torch.Tensor, param: torch.nn.Parameter, value: torch.Tensor) -> None:
    """This rank's piece of a ZeRO-3 parameter (partition ``rank`` of ``ds_numel`` elements, padded at the end)."""
    from deepspeed import comm

    size = param.partition_numel()
    start = size * comm.get_rank(group=param.ds_process_group)
    flat = value.reshape(-1)
    count = max(0, min(piece.numel(), flat.numel() - start))
    if count:
        piece.reshape(-1)[:count].copy_(flat[start:start + count].to(piece.dtype))


# ------------------------------------------------------------------------ optimizer
def base_optimizer(engine: Any) -> torch.optim.Optimizer:
    """The torch optimizer ZeRO steps (its params are flat fp32 partitions, one per param group)."""
    return getattr(engine.optimizer, "optimizer", engine.optimizer)


def full_optimizer_state(engine: Any, order: list[list[str]]) -> dict[str, Any]:
    """The optimizer state as one process's ``state_dict()``; ``order`` names the params of each user group.

    Every rank calls it (the pieces are gathered); every rank gets the result.
    """
    from deepspeed.utils import safe_get_full_optimizer_state

    flat_states = flat_optimizer_states(engine)
    groups = named_groups(engine, order)
    if not flat_states:
        return optimizer_state_by_index({"state": {}, "param_groups": groups})
    keys = [key for key, value in flat_states[0].items() if torch.is_tensor(value) and value.dim() > 0]
    scalars = {key: value for key, value in flat_states[0].items() if key not in keys}
    params = dict(engine.module.named_parameters())
    state: dict[str, dict[str, Any]] = {}  # by parameter name, in the order of the groups
    for name in (name for names in order for name in names):
        param = params[name]
        if not param.requires_grad:
            continue
        entry = {key: _copy(value) for key, value in scalars.items()}
        for key in keys:
            entry[key] = safe_get_full_optimizer_state(param, key).detach().to("cpu", copy=True)
        state[name] = entry
    return optimizer_state_by_index({"state": state, "param_groups": groups})


def named_groups(engine: Any, order: list[list[str]]) -> list[dict[str, Any]]:
    """The base optimizer's param groups, each with the names of the user's parameters it holds."""
    groups = base_optimizer(engine).param_groups
    return [{**{k: v for k, v in group.items() if k != "params"}, "params": names}
            for group, names in zip(groups, order, strict=True)]


def flat_optimizer_states(engine: Any) -> list[dict[str, Any]]:
    """The base optimizer's state of each flat partition (none before its first step)."""
    base = base_optimizer(engine)
    return [base.state[flat] for flat in flat_partitions(engine) if flat in base.state]


def _copy(value: Any) -> Any:
    return value.detach().to("cpu", copy=True) if torch.is_tensor(value) else value


def load_full_optimizer_state(engine: Any, order: list[list[str]], state: Mapping[str, Any], where: str) -> None:
    """Load one process's ``state_dict()`` into the ZeRO pieces; every rank calls it with the whole state."""
    base = base_optimizer(engine)
    saved_groups = state.get("param_groups", [])
    if len(saved_groups) != len(base.param_groups) or [len(g["params"]) for g in saved_groups] != [
            len(names) for names in order]:
        raise DriverError(
            f"load_optimizer_states: {where} has param groups of {[len(g['params']) for g in saved_groups]} "
            f"parameter(s), this optimizer {[len(names) for names in order]}; build the optimizer over the same "
            "parameters, in the same groups, as the run that saved the checkpoint."
        )
    for group, saved in zip(base.param_groups, saved_groups, strict=True):
        group.update({key: value for key, value in saved.items() if key != "params"})
    entries = state.get("state", {})
    if not entries:
        return
    materialise(engine)
    names = [name for group in order for name in group]
    params = dict(engine.module.named_parameters())
    scalars: dict[str, Any] = {}
    for index, entry in entries.items():
        param = params[names[int(index)]]
        for key, value in entry.items():
            if torch.is_tensor(value) and value.dim() > 0:
                _set_optimizer_piece(param, value, key)
            else:
                scalars.setdefault(key, value)
    set_scalars(engine, scalars)


def set_scalars(engine: Any, scalars: Mapping[str, Any]) -> None:
    """The optimizer's per-group scalars (Adam's step) on every flat partition, in the type each had."""
    base = base_optimizer(engine)
    for flat in flat_partitions(engine):
        for key, value in scalars.items():
            current = base.state[flat].get(key)
            base.state[flat][key] = (torch.as_tensor(value, dtype=current.dtype, device=current.device).clone()
                                     if torch.is_tensor(current) else value)


def _set_optimizer_piece(param: torch.nn.Parameter, value: torch.Tensor, key: str) -> None:
    from deepspeed.utils import safe_set_full_optimizer_state

    if _zero3(param):
        optimizer = param._z3_optimizer
        piece, _ = optimizer._get_fp32_opt_state_partition(param, release_swap_buffers=False, optim_state_key=key)
        _fill_zero3(piece, param, value.to(piece.device))
    else:
        safe_set_full_optimizer_state(param, value.to(param.device, torch.float32), key)


def flat_partitions(engine: Any) -> list[torch.Tensor]:
    """The flat fp32 pieces the base optimizer steps (its state is keyed by them)."""
    zero = engine.optimizer
    if hasattr(zero, "fp32_partitioned_groups_flat"):
        return list(zero.fp32_partitioned_groups_flat)
    return [p for group in base_optimizer(engine).param_groups for p in group["params"]]


def materialise(engine: Any) -> None:
    """Give a fresh optimizer its state (it has none before its first step) without moving a weight.

    One step at learning rate 0 with zero gradients creates every entry (Adam's moments, the step count); the
    loaded values then overwrite them. ZeRO-1/2 link their fragments to that state afterwards.
    """
    base, zero = base_optimizer(engine), engine.optimizer
    flats = flat_partitions(engine)
    if all(p in base.state for p in flats):
        return
    rates = [group["lr"] for group in base.param_groups]
    for group in base.param_groups:
        group["lr"] = 0.0
    for flat in flats:
        flat.grad = torch.zeros_like(flat)
    three = hasattr(zero, "fp32_partitioned_groups_flat")  # ZeRO-3 lends its pieces to the groups only to step
    try:
        if three:
            zero._set_fp32_optimizer_param_groups()
        base.step()
    finally:
        if three:
            zero._clear_fp32_optimizer_param_groups()
        for group, rate in zip(base.param_groups, rates, strict=True):
            group["lr"] = rate
        for flat in flats:
            flat.grad = None
    link = getattr(engine.optimizer, "_lazy_init_hp_params_optimizer_state", None)
    if callable(link):
        link()
