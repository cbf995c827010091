"""Sharded checkpoints for the torch drivers: each rank's pieces out, any layout back in.

Out (``driver="torch_fsdp"``): the model's and optimizers' state dicts as
``torch.distributed.checkpoint.state_dict`` gives them unsharded-by-name (keys are
parameter names, values DTensors); each DTensor contributes the rank's local piece
with its place in the full tensor, a plain tensor (Adam's ``step``) comes from rank 0.

In (every torch driver): the same state dicts serve as templates. Each tensor this
rank holds (a DTensor's local piece, or a whole tensor in a one-process or DDP run)
is filled from the stored chunks that overlap it, read from the safetensors files
by slice (memory-mapped: a rank reads only what it keeps). So a checkpoint written
by N ranks loads at M ranks, into DDP or into one process, and nothing is unpickled.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import safetensors
import torch
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.tensor import DTensor

from drivetrain.backend import (
    MODEL_PREFIX,
    CheckpointError,
    ShardPiece,
    ShardSource,
    StateShards,
    check_shard_model,
    check_shard_optimizers,
)


# ----------------------------------------------------------------------------------------- saving
def state_shards(module: torch.nn.Module, optimizers: list[torch.optim.Optimizer], rank: int) -> StateShards:
    """This rank's pieces of ``module``'s and ``optimizers``' states (see the module docstring)."""
    pieces: dict[str, ShardPiece] = {}
    for name, value in get_model_state_dict(module).items():
        _add_piece(pieces, MODEL_PREFIX + name, value, rank)
    metas = [_optimizer_pieces(module, opt, i, rank, pieces) for i, opt in enumerate(optimizers)]
    return StateShards(pieces, {"optimizers": metas})


def _add_piece(pieces: dict[str, ShardPiece], key: str, value: torch.Tensor, rank: int) -> None:
    if isinstance(value, DTensor):
        coordinate = value.device_mesh.get_coordinate()
        owner = coordinate is not None and all(
            c == 0 for c, placement in zip(coordinate, value.placements, strict=True) if placement.is_replicate())
        local = value.to_local()
        if owner and (local.numel() or not value.numel()):
            (chunk,) = value.__create_chunk_list__()
            pieces[key] = ShardPiece(local, tuple(chunk.offsets), tuple(value.shape))
    elif rank == 0:
        pieces[key] = ShardPiece(value, (0,) * value.dim(), tuple(value.shape))


def _optimizer_pieces(module: torch.nn.Module, optimizer: torch.optim.Optimizer, index: int, rank: int,
                      pieces: dict[str, ShardPiece]) -> dict[str, Any]:
    """Add the optimizer's tensors to ``pieces``; return its plain data (groups by parameter name, scalars)."""
    if not optimizer.state:  # not stepped yet: DCP would take a zero-learning-rate step to create the state
        state, groups = {}, named_groups(module, optimizer)
    else:
        by_name = get_optimizer_state_dict(module, optimizer)
        state, groups = by_name["state"], by_name["param_groups"]
    tensors: dict[str, list[str]] = {}
    values: dict[str, dict[str, Any]] = {}
    for param, entries in state.items():
        for entry, value in entries.items():
            if isinstance(value, torch.Tensor):
                _add_piece(pieces, optimizer_key(index, param, entry), value, rank)
                tensors.setdefault(param, []).append(entry)
            else:
                values.setdefault(param, {})[entry] = value
    return {"param_groups": [plain_group(g) for g in groups], "tensors": tensors, "values": values}


def optimizer_key(index: int, param: str, entry: str) -> str:
    return f"optimizers/{index}/{param}/{entry}"


def plain_group(group: Mapping[str, Any]) -> dict[str, Any]:
    """A param group as plain data (a tensor learning rate, as capturable optimizers keep it, as its value)."""
    return {k: v.item() if isinstance(v, torch.Tensor) and v.numel() == 1 else v for k, v in group.items()}


def named_groups(module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    """The optimizer's param groups with each parameter given by its name in ``module``."""
    names = {id(p): name for name, p in module.named_parameters()}
    return [{**{k: v for k, v in g.items() if k != "params"}, "params": [names.get(id(p), "?") for p in g["params"]]}
            for g in optimizer.param_groups]


# ----------------------------------------------------------------------------------------- loading
def load_state_shards(module: torch.nn.Module, optimizers: list[torch.optim.Optimizer], source: ShardSource,
                      with_optimizers: bool) -> None:
    """Fill ``module`` (and ``optimizers``) from ``source``, each rank reading only the slices it keeps.

    Names, shapes and parameter groups are checked first: a mismatch raises and loads nothing.
    """
    model = get_model_state_dict(module)
    check_shard_model(model, source)
    groups = [[g["params"] for g in named_groups(module, optimizer)] for optimizer in optimizers]
    metas = check_shard_optimizers(source, groups) if with_optimizers else []
    with contextlib.ExitStack() as files, torch.no_grad():
        reader = ShardReader(files)
        for name, tensor in model.items():
            if name not in source.frozen:  # a frozen parameter the checkpoint left out keeps the model's value
                reader.fill(source, MODEL_PREFIX + name, tensor)
        for index, (optimizer, meta) in enumerate(zip(optimizers if with_optimizers else [], metas, strict=True)):
            _load_optimizer(module, optimizer, index, meta, source, reader)


class ShardReader:
    """Open safetensors files once per load and copy stored slices into the tensors being loaded."""

    def __init__(self, files: contextlib.ExitStack) -> None:
        self._stack = files
        self._open: dict[str, Any] = {}

    def fill(self, source: ShardSource, key: str, target: torch.Tensor) -> None:
        if isinstance(target, DTensor):
            local = target.to_local()
            (chunk,) = target.__create_chunk_list__()
            self.fill_box(source, key, local, tuple(chunk.offsets))
        else:
            self.fill_box(source, key, target, (0,) * target.dim())

    def fill_box(self, source: ShardSource, key: str, local: torch.Tensor, offsets: tuple[int, ...]) -> None:
        """Fill ``local``, the box of ``key`` that starts at ``offsets`` of the full tensor."""
        for read in source.reads(key, offsets, tuple(local.shape)):
            handle = self._file(read.path)
            stored = handle.get_tensor(read.key) if read.whole else handle.get_slice(read.key)[read.source]
            local[read.target].copy_(stored)

    def _file(self, path: str) -> Any:
        if path not in self._open:
            self._open[path] = self._stack.enter_context(safetensors.safe_open(path, framework="pt"))
        return self._open[path]


def _load_optimizer(module: torch.nn.Module, optimizer: torch.optim.Optimizer, index: int, meta: Mapping[str, Any],
                    source: ShardSource, reader: ShardReader) -> None:
    saved: Mapping[str, list[str]] = meta["tensors"]
    if not saved and not meta["values"]:  # saved before its first step
        optimizer.state.clear()
        for group, stored in zip(optimizer.param_groups, meta["param_groups"], strict=True):
            group.update({k: v for k, v in stored.items() if k != "params"})
        return
    template = get_optimizer_state_dict(module, optimizer)  # creates the state (zero-rate step) when it has none
    state = {param: dict(template["state"].get(param, {})) for param in {*saved, *meta["values"]}}
    for param, entries in saved.items():
        for entry in entries:
            if entry not in state[param]:
                raise CheckpointError(f"{source.folder}: optimizers[{index}] holds {entry!r} for {param!r}, which "
                                      f"this {type(optimizer).__name__} does not keep; use the optimizer class "
                                      "of the run that saved it.")
            reader.fill(source, optimizer_key(index, param, entry), state[param][entry])
    for param, values in meta["values"].items():
        state[param].update(values)
    set_optimizer_state_dict(module, optimizer, {"state": state, "param_groups": meta["param_groups"]})
