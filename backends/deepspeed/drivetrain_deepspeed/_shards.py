"""Sharded checkpoints of DeepSpeed engines: each rank writes the state it owns, any layout is read back.

ZeRO splits the fp32 master weights and the optimizer state by flat ranges: ZeRO-3 flattens
every parameter and gives rank ``r`` the elements ``r*P .. (r+1)*P`` (``P`` the partition
size, the last one padded); ZeRO-1/2 flatten a whole parameter group and give each rank a
contiguous slice of it, so a rank owns a flat range (a "fragment") of some parameters and
nothing of others. Either way a rank's part of a parameter is one flat range, and a flat range
of a matrix is a partial row, whole rows and a partial row: each rank gives its range of every
parameter and of every optimizer tensor as those boxes (:func:`drivetrain.backend.flat_range_boxes`),
under the keys the torch drivers use (``model/<name>``, ``optimizers/0/<name>/<entry>``, see
``optimizer_key`` of :mod:`drivetrain_torch.extension`). Nothing is gathered: a rank writes and reads only its own ranges, which the
stored chunks of any other layout (FSDP's rows, another stage or world size, one process)
fill slice by slice. The weights are the fp32 master copy, saved in the dtype the user's model
had; ZeRO-1/2 keep the model's own copy whole on every rank, and load it whole.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping
from typing import Any

import torch

from drivetrain.backend import (
    MODEL_PREFIX,
    ShardPiece,
    ShardSource,
    StateShards,
    check_shard_model,
    check_shard_optimizers,
    flat_range_boxes,
)
from drivetrain_torch.extension import ShardReader, optimizer_key, plain_group

from . import _state as _ds


class _Local:
    """This rank's flat range of one parameter: where it starts, how long it is, and the fp32 tensors that hold
    it (the master weights, and each optimizer entry's); ``count`` is 0 where the rank owns none of it."""

    def __init__(self, param: torch.nn.Parameter) -> None:
        self.param = param
        self.zero3 = hasattr(param, "ds_id")
        self.shape = tuple(param.ds_shape) if self.zero3 else tuple(param.shape)
        if self.zero3:
            from deepspeed import comm

            size = param.partition_numel()
            self.start = size * comm.get_rank(group=param.ds_process_group)
            self.count = max(0, min(size, param.ds_numel - self.start))
        else:
            mapping = getattr(param, "_hp_mapping", None)
            self.start = mapping.lp_fragment_address.start if mapping is not None else 0
            self.count = mapping.lp_fragment_address.numel if mapping is not None else 0

    def master(self) -> torch.Tensor | None:
        """The fp32 master weights of the range (None for a frozen parameter, which has none)."""
        return self.entry(None) if self.param.requires_grad and self.count else None

    def entry(self, key: str | None) -> torch.Tensor:
        """The range of the optimizer's ``key`` tensor (``None``: the master weights), flat, in place."""
        if self.zero3:
            piece, _ = self.param._z3_optimizer._get_fp32_opt_state_partition(
                self.param, release_swap_buffers=False, optim_state_key=key)
        else:
            piece = self.param._hp_mapping.get_hp_fragment(key)
        return piece.reshape(-1)[:self.count]


def _pieces(flat: torch.Tensor, start: int, shape: tuple[int, ...]) -> list[ShardPiece]:
    pieces, at = [], 0
    for offsets, sizes in flat_range_boxes(start, flat.numel(), shape):
        n = math.prod(sizes)
        pieces.append(ShardPiece(flat[at:at + n].reshape(sizes), offsets, shape))
        at += n
    return pieces


def _fill_range(reader: ShardReader, source: ShardSource, key: str, flat: torch.Tensor, start: int,
                shape: tuple[int, ...]) -> None:
    """Fill ``flat`` with elements ``start ..`` of the stored tensor ``key`` (of full ``shape``)."""
    at = 0
    for offsets, sizes in flat_range_boxes(start, flat.numel(), shape):
        n = math.prod(sizes)
        reader.fill_box(source, key, flat[at:at + n].view(sizes), offsets)
        at += n


def _model_names(module: torch.nn.Module) -> tuple[list[tuple[str, torch.nn.Parameter]], dict[str, torch.Tensor]]:
    """Every parameter by every name (tied ones twice, as state_dict() gives them) and the persistent buffers."""
    params = list(module.named_parameters(remove_duplicate=False))
    names = {name for name, _ in params}
    buffers = {name: value for name, value in module.state_dict(keep_vars=True).items() if name not in names}
    return params, buffers


# ----------------------------------------------------------------------------------------- saving
def state_shards(engine: Any, dtypes: Mapping[str, torch.dtype], order: list[list[str]], rank: int) -> StateShards:
    """This rank's ranges of the weights (in the dtypes the user's model had) and of the optimizer state."""
    module = engine.module
    params, buffers = _model_names(module)
    pieces: dict[str, Any] = {}
    for name, param in params:
        local = _Local(param)
        if local.zero3 or hasattr(param, "_hp_mapping"):  # partitioned (ZeRO-1/2: the optimizer's parameters)
            owned_range = local.master()
            if owned_range is None and local.zero3:  # frozen: no master copy, the model's own partition
                owned_range = param.ds_tensor.reshape(-1)[:local.count]
            if owned_range is not None and local.count:
                flat = owned_range.detach().to("cpu", dtype=dtypes.get(name, param.dtype))
                pieces[MODEL_PREFIX + name] = _pieces(flat, local.start, local.shape)
        elif rank == 0:  # ZeRO-1/2, a parameter no optimizer steps: whole on every rank
            whole = param.detach().to("cpu", dtype=dtypes.get(name, param.dtype))
            pieces[MODEL_PREFIX + name] = ShardPiece(whole, (0,) * whole.dim(), local.shape)
    for name, value in buffers.items() if rank == 0 else ():
        buffer = value.detach().cpu()
        pieces[MODEL_PREFIX + name] = ShardPiece(buffer, (0,) * buffer.dim(), tuple(buffer.shape))
    metas = [_optimizer_pieces(engine, dict(params), order, rank, pieces)] if order else []
    return StateShards(pieces, {"optimizers": metas})


def _optimizer_pieces(engine: Any, params: Mapping[str, torch.nn.Parameter], order: list[list[str]], rank: int,
                      pieces: dict[str, Any]) -> dict[str, Any]:
    """Add the optimizer's ranges to ``pieces``; return its plain data in the torch drivers' shape (rank 0's is
    kept, so it lists every entry, also of parameters rank 0 owns nothing of)."""
    groups = [plain_group(group) for group in _ds.named_groups(engine, order)]
    flat_states = _ds.flat_optimizer_states(engine)
    tensors: dict[str, list[str]] = {}
    values: dict[str, dict[str, Any]] = {}
    for name in (name for names in order for name in names):
        param = params[name]
        if not flat_states or not param.requires_grad:
            continue
        local = _Local(param)
        for entry, value in flat_states[0].items():
            key = optimizer_key(0, name, entry)
            if torch.is_tensor(value) and value.dim() > 0:
                if local.count:
                    pieces[key] = _pieces(local.entry(entry).detach().cpu(), local.start, local.shape)
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
    check_shard_model({**shapes, **buffers}, source)
    meta = check_shard_optimizers(source, [order])[0] if with_optimizers and order else None
    with contextlib.ExitStack() as files, torch.no_grad():
        reader = ShardReader(files)
        for name, param in params:
            if name not in source.frozen:  # a frozen parameter the checkpoint left out keeps the model's value
                _load_parameter(reader, source, MODEL_PREFIX + name, param)
        for name, buffer in buffers.items():
            reader.fill(source, MODEL_PREFIX + name, buffer)
        if meta is not None:
            _load_optimizer(engine, source, reader, meta, dict(params))


def _load_parameter(reader: ShardReader, source: ShardSource, key: str, param: torch.nn.Parameter) -> None:
    """This rank's range into the fp32 master copy; the model's own copy too: ZeRO-3's partition (and the whole
    tensor where ZeRO-3 keeps a parameter on every rank, below stage3_param_persistence_threshold), ZeRO-1/2's
    whole tensor (it is on every rank)."""
    local = _Local(param)
    master = local.master()
    if not local.zero3:
        reader.fill(source, key, param.data)
        if master is not None:
            _fill_range(reader, source, key, master, local.start, local.shape)
        return
    partition = param.ds_tensor.reshape(-1)[:local.count]
    _fill_range(reader, source, key, partition if master is None else master, local.start, local.shape)
    if master is not None:
        partition.copy_(master)
    if param.ds_numel and param.data.numel() == param.ds_numel:
        reader.fill_box(source, key, param.data.view(local.shape), (0,) * len(local.shape))


def _load_optimizer(engine: Any, source: ShardSource, reader: ShardReader, meta: Mapping[str, Any],
                    params: Mapping[str, torch.nn.Parameter]) -> None:
    base = _ds.base_optimizer(engine)
    for group, stored in zip(base.param_groups, meta["param_groups"], strict=True):
        group.update({k: v for k, v in stored.items() if k != "params"})
    if not meta["tensors"] and not meta["values"]:
        return
    _ds.materialise(engine)
    scalars: dict[str, Any] = {}
    for name, entries in meta["tensors"].items():
        local = _Local(params[name])
        for entry in entries:
            key = optimizer_key(0, name, entry)
            if source.shape(key) == ():
                scalars[entry] = torch.empty(())
                reader.fill_box(source, key, scalars[entry], ())
            elif local.count:
                _fill_range(reader, source, key, local.entry(entry), local.start, local.shape)
    for values in meta["values"].values():
        scalars.update({k: v for k, v in values.items() if k not in scalars})
    _ds.set_scalars(engine, scalars)
