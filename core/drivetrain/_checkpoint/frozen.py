"""Frozen parameters in checkpoints: written once with the base model, not into every checkpoint.

A model whose parameters partly do not train (a LoRA adapter on a frozen base, a frozen encoder)
changes only in its trainable part. Checkpoints and ``save_model`` folders keep that part, every
buffer, and a *fingerprint* of the frozen parameters in the manifest (``frozen``: each one's dtype,
shape and checksum); loading takes the frozen values from the model being loaded into after checking
them against the fingerprint, so a resume onto another base (other weights, another architecture,
another dtype) is refused, never silently mixed.

The driver says which parameters are frozen (``Driver.frozen_parameter_names``: ``requires_grad``,
``stop_gradient``, ``stop_grad``); ``save_frozen=True`` writes them too (a standalone model file).
Sharded checkpoints (FSDP, ZeRO) leave them out of every rank's shard file the same way.

The checksum of a tensor is a sum over its elements of (bit pattern x odd position weight) modulo 2**64, so
the ranks of a sharded model each add up the pieces they hold and the sums combine into the value an
unsharded model gives: a checkpoint written at one world size is checked at any other. The
fingerprint reads the frozen bytes once per driver and set of names (they do not change while
training), and once per load.
"""

from __future__ import annotations

import math
import weakref
import zlib
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from .._format import CheckpointError
from ..backend import Driver

_MOD = 1 << 64  # the checksums' arithmetic: numpy's uint64, wrapping
_BLOCK = 1 << 22  # elements summed at once: bounds the temporary memory of a checksum

Piece = tuple[Any, tuple[int, ...], tuple[int, ...]]
"""``(tensor, offsets, full shape)``: a tensor, or a box of one starting at ``offsets``."""

_cache: weakref.WeakKeyDictionary[Driver, tuple[tuple[str, ...], dict[str, Any]]] = weakref.WeakKeyDictionary()


def frozen_names(driver: Driver, names: Iterable[str], save_frozen: bool) -> tuple[str, ...]:
    """The frozen parameters among ``names`` (model state names) that a save leaves out, sorted."""
    return () if save_frozen else tuple(sorted(set(driver.frozen_parameter_names()) & set(names)))


def split_frozen(driver: Driver, state: Mapping[str, Any], save_frozen: bool) -> tuple[dict[str, Any], dict | None]:
    """``(the tensors to write, the manifest record of those left out)``; the record is None when nothing is
    left out (no frozen parameter, or ``save_frozen``)."""
    names = frozen_names(driver, state, save_frozen)
    if not names:
        return dict(state), None
    record = combine([cached_sums(driver, names, lambda: {n: [(state[n], (), ())] for n in names})])
    return {k: v for k, v in state.items() if k not in record["tensors"]}, record


def cached_sums(driver: Driver, names: tuple[str, ...], pieces: Any) -> dict[str, tuple]:
    """:func:`partial_sums` of ``pieces()``, computed the first time a driver asks for these names (frozen
    values do not change while training)."""
    cached = _cache.get(driver)
    if cached is None or cached[0] != names:
        cached = names, partial_sums(driver, pieces())
        _cache[driver] = cached
    return cached[1]


def partial_sums(driver: Driver, pieces: Mapping[str, list[Piece]]) -> dict[str, tuple]:
    """Per name, ``(dtype, full shape, checksum, bytes)`` of the pieces this process holds (``(tensor, (), ())``
    for a whole tensor); :func:`combine` adds up those of every rank of a sharded model."""
    return {name: _sum_pieces(driver, given) for name, given in pieces.items()}


def combine(ranks: Iterable[Mapping[str, tuple]]) -> dict[str, Any]:
    """The fingerprint ``{"tensors": {name: [dtype, shape, checksum]}, "bytes": total}`` from the
    :func:`partial_sums` of every rank (each element held by one rank)."""
    described: dict[str, list[Any]] = {}
    total = 0
    for held in ranks:
        for name, (dtype, shape, checksum, size) in held.items():
            entry = described.setdefault(name, [dtype, list(shape), 0])
            entry[2] = (entry[2] + checksum) % _MOD
            total += size
    return {"tensors": dict(sorted(described.items())), "bytes": total}


def _sum_pieces(driver: Driver, pieces: list[Piece]) -> tuple[str, list[int], int, int]:
    dtype, full, checksum, size = "", [], 0, 0
    for tensor, offsets, shape in pieces:
        dtype, local, data = _bytes_of(driver, tensor)
        full = list(shape or local)
        checksum = (checksum + box_checksum(data, offsets or (0,) * len(local), local, full)) % _MOD
        size += len(data)
    return dtype, full, checksum, size


def box_checksum(data: memoryview, offsets: tuple[int, ...], sizes: tuple[int, ...], shape: list[int]) -> int:
    """Sum of ``bits(x) * (2 * flat position of x in the full tensor + 1)`` modulo 2**64 over the box's elements.

    The box is read as rows along its last axis: a row starting at flat position ``s`` adds
    ``(2s + 1) * sum(bits) + 2 * sum(k * bits[k])``, a few vectorised passes over the data.
    """
    count = math.prod(sizes)
    if count == 0:
        return 0
    bits = np.frombuffer(data, dtype=f"<u{len(data) // count}")
    if not sizes:
        offsets, sizes, shape = (0,), (1,), [1]
    strides = [math.prod(shape[k + 1:]) for k in range(len(shape))]
    starts = np.full(1, offsets[-1], dtype=np.uint64)  # the flat position of each row's first element
    for axis in range(len(sizes) - 2, -1, -1):
        axis_positions = (offsets[axis] + np.arange(sizes[axis], dtype=np.uint64)) * np.uint64(strides[axis])
        starts = np.add.outer(axis_positions, starts).ravel()
    length = sizes[-1]
    rows = bits.reshape(-1, length)
    total = 0
    for first_column in range(0, length, _BLOCK):
        columns = slice(first_column, min(length, first_column + _BLOCK))
        ks = np.arange(columns.start, columns.stop, dtype=np.uint64)
        per_block = max(1, _BLOCK // len(ks))
        for first in range(0, len(rows), per_block):
            block = rows[first:first + per_block, columns]
            row_sums = block.sum(axis=1, dtype=np.uint64)
            row_dots = (block * ks).sum(axis=1, dtype=np.uint64)
            weights = np.uint64(2) * starts[first:first + per_block] + np.uint64(1)
            total += int((weights * row_sums + np.uint64(2) * row_dots).sum(dtype=np.uint64))
    return total % _MOD


def _bytes_of(driver: Driver, tensor: Any) -> tuple[str, tuple[int, ...], memoryview]:
    if type(driver).tensor_buffer is not Driver.tensor_buffer:
        dtype, shape, data = driver.tensor_buffer(tensor)
        return dtype, tuple(shape), memoryview(data).cast("B")
    array = np.ascontiguousarray(driver.tensor_to_numpy(tensor))
    return array.dtype.str, tuple(array.shape), memoryview(array.tobytes())


def check_frozen(driver: Driver, record: Mapping[str, Any], pieces: Any, where: str, gather: bool) -> None:
    """Raise unless the model's frozen parameters, whose pieces this rank holds (``pieces()``, as for
    :func:`partial_sums`; ``gather``: every rank of a sharded model calls it), are the ones ``record`` describes."""
    described = record.get("tensors", {})
    if "crc32" in record:  # written before the checksum could be summed over shards: whole tensors only
        mine = _crc_record(driver, pieces())
    else:
        sums = partial_sums(driver, pieces())
        mine = combine(driver.all_gather_object(sums) if gather and driver.is_distributed() else [sums])
    missing_frozen(record, mine["tensors"], where)
    if mine["tensors"] == described and mine.get("crc32") == record.get("crc32"):
        return
    differ = sorted(n for n in described if mine["tensors"][n][:2] != described[n][:2])
    what = (f"dtypes or shapes differ for {differ[:5]} (saved {[described[n][:2] for n in differ[:5]]}, this "
            f"model {[mine['tensors'][n][:2] for n in differ[:5]]})" if differ else
            "their values differ (another base checkpoint, or the base was changed after loading)")
    raise CheckpointError(
        f"{where} was saved without its {len(described)} frozen parameter(s) ({record.get('bytes', 0)} bytes), "
        f"to be taken from the model it is loaded into, but this model's frozen parameters are not the ones it "
        f"was trained on: {what}. Load the same base weights first (e.g. from_pretrained of the same "
        "checkpoint), or load a folder saved with save_frozen=True. Nothing was loaded.")


def _crc_record(driver: Driver, pieces: Mapping[str, list[Piece]]) -> dict[str, Any]:
    crc, described = 0, {}
    for name in sorted(pieces):
        dtype, shape, data = _bytes_of(driver, pieces[name][0][0])
        described[name] = [dtype, list(shape)]
        crc = zlib.crc32(data, zlib.crc32(name.encode(), crc))
    return {"tensors": described, "crc32": crc}


def missing_frozen(record: Mapping[str, Any] | None, present: Iterable[str], where: str) -> None:
    """Raise when the model lacks some of the frozen parameters a folder left out."""
    described = (record or {}).get("tensors", {})
    missing = sorted(set(described) - set(present))
    if missing:
        raise CheckpointError(
            f"{where} was saved without its {len(described)} frozen parameter(s), to be taken from the model it is "
            f"loaded into, but this model has no {missing[:5]}: build the same base model (with the same frozen "
            "layers) before loading, or load a folder saved with save_frozen=True.")


def complete_with_frozen(driver: Driver, saved: Mapping[str, Any], record: Mapping[str, Any] | None,
                         where: str) -> dict[str, Any]:
    """``saved`` plus the frozen tensors the folder left out, taken from the model being loaded into once they
    match the folder's fingerprint; ``saved`` as it is when the folder left nothing out."""
    if not record:
        return dict(saved)
    described = record.get("tensors", {})
    current = driver.model_state()
    missing_frozen(record, current, where)
    check_frozen(driver, record, lambda: {n: [(current[n], (), ())] for n in described}, where, gather=False)
    return {**{name: current[name] for name in described}, **saved}
