"""Sharded checkpoints of DeepSpeed engines: ZeRO-3's partitions written in place, any layout read back.

ZeRO-3 flattens every parameter and gives rank ``r`` the elements ``r*P .. (r+1)*P`` (``P`` the
partition size, the last one padded). A flat range of a matrix is a partial row, whole rows and
a partial row, so each rank gives its range of every parameter, and of every optimizer tensor
(Adam's moments live in the same partitions), as those boxes
(:func:`drivetrain.backend.flat_range_boxes`), under the keys the torch drivers use
(``model/<name>``, ``optimizers/0/<name>/<entry>``, see :mod:`.shards`). Nothing is gathered:
a rank writes and reads only its own range, which the stored chunks of any other layout
(FSDP's rows, another world size, one process) fill slice by slice.

ZeRO-1/2 keep the weights whole on every rank and write the gathered one-file format; they
read a sharded checkpoint whole (every tensor assembled from its chunks) into the same setters
as a one-file checkpoint.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping
from typing import Any

import torch

from drivetrain.backend import (
    MODEL_PREFIX,
    CheckpointError,
    ShardPiece,
    ShardSource,
    StateShards,
    flat_range_boxes,
)

from . import _deepspeed_state as _ds
from .shards import Reader, check_model, optimizer_key, plain_group


def _flat_range(param: torch.nn.Parameter) -> tuple[int, int]:
    """(first element, count) of this rank's partition of a ZeRO-3 parameter, padding left out."""
    from deepspeed import comm

    size = param.partition_numel()
    start = size * comm.get_rank(group=param.ds_process_group)
    return start, max(0, min(size, param.ds_numel - start))


def _pieces(flat: torch.Tensor, start: int, shape: tuple[int, ...]) -> list[ShardPiece]:
    pieces, at = [], 0
    for offsets, sizes in flat_range_boxes(start, flat.numel(), shape):
        n = math.prod(sizes)
        pieces.append(ShardPiece(flat[at:at + n].reshape(sizes), offsets, shape))
        at += n
    return pieces


def _fill_range(reader: Reader, source: ShardSource, key: str, flat: torch.Tensor, start: int,
                shape: tuple[int, ...]) -> None:
    """Fill ``flat`` with elements ``start ..`` of the stored tensor ``key`` (of full ``shape``)."""
    at = 0
    for offsets, sizes in flat_range_boxes(start, flat.numel(), shape):
        n = math.prod(sizes)
        reader.fill_box(source, key, flat[at:at + n].view(sizes), offsets)
        at += n


def _model_names(module: torch.nn.Module) -> tuple[list[tuple[str, torch.nn.Parameter]], list[str]]:
    """Every parameter by every name (tied ones twice, as state_dict() gives them) and the persistent buffers."""
    params = list(module.named_parameters(remove_duplicate=False))
    names = {name for name, _ in params}
    buffers = [name for name in module.state_dict(keep_vars=True) if name not in names]
    return params, buffers


# ----------------------------------------------------------------------------------------- saving
def state_shards(engine: Any, dtypes: Mapping[str, torch.dtype], order: list[list[str]], rank: int) -> StateShards:
    """This rank's partitions of the weights (in the dtypes the user's model had) and of the optimizer state."""
    from deepspeed.utils import safe_get_local_fp32_param

    module = engine.module
    params, buffers = _model_names(module)
    pieces: dict[str, Any] = {}
    for name, param in params:
        start, count = _flat_range(param)
        local = safe_get_local_fp32_param(param) if param.requires_grad else param.ds_tensor
        flat = local.detach().reshape(-1)[:count].to("cpu", dtype=dtypes.get(name, local.dtype))
        pieces[MODEL_PREFIX + name] = _pieces(flat, start, tuple(param.ds_shape))
    owned = dict(module.state_dict(keep_vars=True))
    for name in buffers if rank == 0 else ():
        buffer = owned[name].detach().cpu()
        pieces[MODEL_PREFIX + name] = ShardPiece(buffer, (0,) * buffer.dim(), tuple(buffer.shape))
    metas = [_optimizer_pieces(engine, dict(params), order, rank, pieces)] if order else []
    return StateShards(pieces, {"optimizers": metas})


def _optimizer_pieces(engine: Any, params: Mapping[str, torch.nn.Parameter], order: list[list[str]], rank: int,
                      pieces: dict[str, Any]) -> dict[str, Any]:
    """Add the optimizer's partitions to ``pieces``; return its plain data in the torch drivers' shape."""
    base = _ds.base_optimizer(engine)
    hyper = [{k: v for k, v in group.items() if k != "params"} for group in base.param_groups]
    groups = [plain_group({**h, "params": names}) for h, names in zip(hyper, order, strict=True)]
    flat_states = [base.state[flat] for flat in _ds.flat_partitions(engine) if flat in base.state]
    tensors: dict[str, list[str]] = {}
    values: dict[str, dict[str, Any]] = {}
    for name in (name for names in order for name in names):
        param = params[name]
        if not flat_states or not param.requires_grad:
            continue
        start, count = _flat_range(param)
        for entry, value in flat_states[0].items():
            key = optimizer_key(0, name, entry)
            if torch.is_tensor(value) and value.dim() > 0:
                local = param._z3_optimizer.get_local_fp32_param(param, entry)
                pieces[key] = _pieces(local.detach().reshape(-1)[:count].cpu(), start, tuple(param.ds_shape))
            elif torch.is_tensor(value):  # Adam's step: the same on every rank, written by rank 0
                if rank == 0:
                    pieces[key] = ShardPiece(value.detach().cpu().clone(), (), ())
            else:
                values.setdefault(name, {})[entry] = value
                continue
            tensors.setdefault(name, []).append(entry)
    return {"param_groups": groups, "tensors": tensors, "values": values}


# ----------------------------------------------------------------------------------------- loading
def load_state_shards(engine: Any, source: ShardSource, with_optimizers: bool, order: list[list[str]]) -> None:
    """Fill the engine from ``source``, checked first (names, shapes, groups: a mismatch loads nothing)."""
    module = engine.module
    params, buffers = _model_names(module)
    shapes = {name: torch.empty(getattr(p, "ds_shape", p.shape), device="meta") for name, p in params}
    owned = dict(module.state_dict(keep_vars=True))
    check_model({**shapes, **{name: owned[name] for name in buffers}}, source)
    meta = _check_optimizer(source, order) if with_optimizers and order else None
    three = any(hasattr(p, "ds_id") for _, p in params)
    with contextlib.ExitStack() as files, torch.no_grad():
        reader = Reader(files)
        if not three:
            _load_whole(engine, source, reader, meta, order, params, buffers)
            return
        for name, param in params:
            _load_partition(reader, source, MODEL_PREFIX + name, param)
        for name in buffers:
            reader.fill(source, MODEL_PREFIX + name, owned[name])
        if meta is not None:
            _load_optimizer(engine, source, reader, meta, dict(params))


def _check_optimizer(source: ShardSource, order: list[list[str]]) -> Mapping[str, Any]:
    metas = source.meta.get("optimizers") if isinstance(source.meta, dict) else None
    if not isinstance(metas, list) or len(metas) != 1:
        raise CheckpointError(
            f"{source.folder} holds {len(metas) if isinstance(metas, list) else 'no'} optimizer state(s); "
            "driver='deepspeed' trains with one optimizer. Pass the optimizers of the run that saved it."
        )
    saved = [list(g["params"]) for g in metas[0]["param_groups"]]
    if saved != order:
        raise CheckpointError(
            f"{source.folder}: the optimizer was saved over other parameters or groups (saved groups "
            f"{[len(g) for g in saved]} parameters, this one {[len(g) for g in order]}); build the optimizer over the "
            "same parameters, in the same groups, as the run that saved it. Nothing was loaded."
        )
    return metas[0]


def _load_partition(reader: Reader, source: ShardSource, key: str, param: torch.nn.Parameter) -> None:
    """This rank's range into the fp32 master partition and the model's own partition; a parameter ZeRO-3 keeps
    whole on every rank (below stage3_param_persistence_threshold) is also filled whole."""
    start, count = _flat_range(param)
    shape = tuple(param.ds_shape)
    if param.requires_grad:
        master, _ = param._z3_optimizer._get_fp32_opt_state_partition(param, release_swap_buffers=False)
        _fill_range(reader, source, key, master.reshape(-1)[:count], start, shape)
        param.ds_tensor.reshape(-1)[:count].copy_(master.reshape(-1)[:count])
    else:
        _fill_range(reader, source, key, param.ds_tensor.reshape(-1)[:count], start, shape)
    if param.data.numel() == param.ds_numel:
        reader.fill_box(source, key, param.data.view(shape), (0,) * len(shape))


def _load_optimizer(engine: Any, source: ShardSource, reader: Reader, meta: Mapping[str, Any],
                    params: Mapping[str, torch.nn.Parameter]) -> None:
    base = _ds.base_optimizer(engine)
    for group, stored in zip(base.param_groups, meta["param_groups"], strict=True):
        group.update({k: v for k, v in stored.items() if k != "params"})
    if not meta["tensors"] and not meta["values"]:
        return
    _ds.materialise(engine)
    scalars: dict[str, Any] = {}
    for name, entries in meta["tensors"].items():
        param = params[name]
        start, count = _flat_range(param)
        for entry in entries:
            key = optimizer_key(0, name, entry)
            if source.shape(key) == ():
                scalars[entry] = torch.empty(())
                reader.fill_box(source, key, scalars[entry], ())
                continue
            piece, _ = param._z3_optimizer._get_fp32_opt_state_partition(param, release_swap_buffers=False,
                                                                          optim_state_key=entry)
            _fill_range(reader, source, key, piece.reshape(-1)[:count], start, tuple(param.ds_shape))
    for values in meta["values"].values():
        scalars.update({k: v for k, v in values.items() if k not in scalars})
    _ds.set_scalars(engine, scalars)


def _load_whole(engine: Any, source: ShardSource, reader: Reader, meta: Mapping[str, Any] | None,
                order: list[list[str]], params: list[tuple[str, torch.nn.Parameter]], buffers: list[str]) -> None:
    """ZeRO-1/2: every tensor assembled whole from its chunks, then set as a one-file checkpoint is."""

    def whole(key: str, like: torch.Tensor | None = None) -> torch.Tensor:
        tensor = torch.empty(source.shape(key), dtype=torch.float32 if like is None else like.dtype)
        reader.fill(source, key, tensor)
        return tensor

    tensors = {name: buffer for name, buffer in engine.module.named_buffers()}  # non-persistent ones stay
    tensors.update({name: whole(MODEL_PREFIX + name, tensors[name]) for name in buffers})
    tensors.update({name: whole(MODEL_PREFIX + name) for name, _ in params})
    _ds.load_full_model_state(engine.module, tensors)
    if meta is None:
        return
    names = [name for names in order for name in names]
    state = {index: {entry: whole(optimizer_key(0, name, entry)) for entry in meta["tensors"].get(name, [])}
             | meta["values"].get(name, {}) for index, name in enumerate(names)
             if name in meta["tensors"] or name in meta["values"]}
    groups, at = [], 0
    for stored in meta["param_groups"]:
        groups.append({**stored, "params": list(range(at, at + len(stored["params"])))})
        at += len(stored["params"])
    _ds.load_full_optimizer_state(engine, order, {"state": state, "param_groups": groups}, source.folder)
