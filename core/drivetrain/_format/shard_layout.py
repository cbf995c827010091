"""The layout of a sharded checkpoint as data: the pieces a rank gives, and the read plans a loading rank gets.

:mod:`.sharded` writes and opens sharded checkpoints through a driver; what a driver hands
over (:class:`StateShards` of :class:`ShardPiece`) and what it reads from
(:class:`ShardSource`, whose :meth:`ShardSource.reads` plan which stored slices fill a
piece) live here, apart from any driver, so the Driver class can name them without
depending on the checkpoint code that depends on it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .folder import CheckpointError

MODEL_PREFIX = "model/"
LAYOUT_FILE = "shards.json"


@dataclass(frozen=True)
class ShardPiece:
    """One rank's piece of a tensor: ``tensor`` (a framework tensor) starts at ``offsets`` of the full
    tensor, whose shape is ``shape``; the piece's own shape gives its extent."""

    tensor: Any
    offsets: tuple[int, ...]
    shape: tuple[int, ...]


@dataclass
class StateShards:
    """What one rank contributes to a sharded checkpoint (see :meth:`Driver.state_shards`).

    ``pieces``: this rank's pieces by state key; a key held whole by every rank (a replicated
    tensor) is given by one rank only (rank 0 by convention). A rank may give a list of pieces
    for one key: boxes that together make its part, e.g. a flat range of a matrix, which is a
    partial row, whole rows and a partial row. Model weights use the keys ``model/<name>``
    (``export_weights`` reads them). ``meta``: plain data the driver needs back at load (nested
    dicts/lists/numbers/strings); rank 0's is kept.
    """

    pieces: dict[str, ShardPiece | list[ShardPiece]]
    meta: Any = None

    def stored(self) -> dict[str, tuple[str, ShardPiece]]:
        """Every piece under the name it has in the rank's file: ``{file name: (state key, piece)}``; the
        pieces of a key given as a list are named ``<key>#<index>``."""
        named: dict[str, tuple[str, ShardPiece]] = {}
        for key, given in self.pieces.items():
            if isinstance(given, ShardPiece):
                named[key] = (key, given)
            else:
                named.update({f"{key}#{i}": (key, piece) for i, piece in enumerate(given)})
        return named


def flat_range_boxes(start: int, count: int, shape: tuple[int, ...]) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """The boxes ``(offsets, sizes)`` that make up elements ``start .. start+count-1`` of a row-major tensor of
    ``shape``, in order: a partial first row, whole rows, a partial last row (recursively in more dimensions).

    For drivers whose shards are flat ranges of the flattened tensor (DeepSpeed ZeRO-3 partitions), so each
    box can be a :class:`ShardPiece` (``flat[i:j].reshape(sizes)``) and a reading rank can ask
    :meth:`ShardSource.reads` for each box of its own range.
    """
    total = math.prod(shape)
    if count < 0 or start < 0 or start + count > total:
        raise ValueError(f"flat_range_boxes: elements {start}..{start + count} do not fit a tensor of shape {shape}.")
    if count == 0:
        return []
    if len(shape) <= 1:
        return [((start,) * len(shape), (count,) * len(shape))]
    row = math.prod(shape[1:])
    boxes: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
    end = start + count
    first, col = divmod(start, row)
    if col:  # a partial first row
        take = min(row - col, count)
        boxes += [((first, *o), (1, *s)) for o, s in flat_range_boxes(col, take, shape[1:])]
        start += take
    if start < end:
        whole = (end - start) // row
        if whole:
            boxes.append(((start // row,) + (0,) * (len(shape) - 1), (whole, *shape[1:])))
            start += whole * row
        if start < end:  # a partial last row
            boxes += [((start // row, *o), (1, *s)) for o, s in flat_range_boxes(0, end - start, shape[1:])]
    return boxes


@dataclass(frozen=True)
class ShardRead:
    """Copy ``source`` slices of the stored piece ``key`` in the safetensors file ``path`` into ``target``
    slices of the piece being loaded; ``whole`` when the stored piece is taken entire (no slicing needed)."""

    path: str
    key: str
    source: tuple[slice, ...]
    target: tuple[slice, ...]
    whole: bool


@dataclass(frozen=True)
class _Chunk:
    file: str
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    key: str | None  # the tensor's name in the file, when not the state key itself


class ShardSource:
    """A verified sharded checkpoint, as a loading driver sees it: keys, shapes, dtypes, meta, and read plans."""

    def __init__(self, folder: str, layout: Mapping[str, Any], meta: Any, world_size: int,
                 frozen: Iterable[str] = ()) -> None:
        self.folder = folder
        self.meta = meta
        self.world_size = world_size
        """How many processes wrote the checkpoint."""
        self.frozen = frozenset(frozen)
        """Frozen parameters (names without the ``model/`` prefix) the checkpoint left out: the loading driver
        keeps the model's own values for them (the core has checked them against the checkpoint's
        fingerprint) and neither expects nor reads them."""
        self._tensors = layout

    @property
    def keys(self) -> frozenset[str]:
        """Every stored state key."""
        return frozenset(self._tensors)

    def model_keys(self) -> dict[str, tuple[int, ...]]:
        """The model's weights: ``{name (without the model/ prefix): full shape}``."""
        return {key[len(MODEL_PREFIX):]: self.shape(key) for key in self._tensors if key.startswith(MODEL_PREFIX)}

    def shape(self, key: str) -> tuple[int, ...]:
        """The full shape of the stored tensor ``key`` (all ranks' pieces together)."""
        return tuple(self._entry(key)["shape"])

    def dtype(self, key: str) -> str:
        """The safetensors dtype tag the key was stored with (``"F32"``, ``"BF16"``, ...)."""
        return str(self._entry(key)["dtype"])

    def _entry(self, key: str) -> Mapping[str, Any]:
        try:
            return self._tensors[key]
        except KeyError:
            raise CheckpointError(f"{self.folder}: the sharded checkpoint holds no {key!r}.") from None

    def reads(self, key: str, offsets: Iterable[int], sizes: Iterable[int]) -> list[ShardRead]:
        """The copies that fill the piece of ``key`` starting at ``offsets`` with extent ``sizes``.

        Raises :class:`CheckpointError` when the stored chunks do not cover the piece (a damaged layout).
        """
        offsets, sizes = tuple(offsets), tuple(sizes)
        entry = self._entry(key)
        if len(offsets) != len(entry["shape"]) or len(sizes) != len(offsets):
            raise CheckpointError(f"{self.folder}: {key!r} has {len(entry['shape'])} dimensions; a piece of "
                                  f"{len(sizes)} was asked for.")
        plans, covered = [], 0
        for chunk in layout_chunks(entry):
            lows = [max(o, c) for o, c in zip(offsets, chunk.offsets, strict=True)]
            highs = [min(o + s, c + n) for o, s, c, n in zip(offsets, sizes, chunk.offsets, chunk.sizes, strict=True)]
            if any(lo >= hi for lo, hi in zip(lows, highs, strict=True)) and offsets:
                continue
            source = tuple(slice(lo - c, hi - c) for lo, hi, c in zip(lows, highs, chunk.offsets, strict=True))
            target = tuple(slice(lo - o, hi - o) for lo, hi, o in zip(lows, highs, offsets, strict=True))
            whole = all(s.stop - s.start == n for s, n in zip(source, chunk.sizes, strict=True))
            plans.append(ShardRead(os.path.join(self.folder, chunk.file), chunk.key or key, source, target, whole))
            covered += math.prod(hi - lo for lo, hi in zip(lows, highs, strict=True))
            if not offsets:
                break
        if covered != math.prod(sizes):
            raise CheckpointError(f"{self.folder}: the stored chunks of {key!r} cover {covered} of the "
                                  f"{math.prod(sizes)} values asked for; shards.json is damaged.")
        return plans


def layout_chunks(entry: Mapping[str, Any]) -> list[_Chunk]:
    """The stored chunks of one tensor's layout entry (a KeyError/TypeError/ValueError when it is damaged)."""
    return [_Chunk(c["file"], tuple(c["offsets"]), tuple(c["sizes"]), c.get("key")) for c in entry["chunks"]]


def cannot_read_shards(driver_name: str, source: ShardSource) -> CheckpointError:
    """The error for a driver that does not read sharded checkpoints (``reads_state_shards=False``)."""
    return CheckpointError(
        f"{source.folder} was written in shards by {source.world_size} process(es); driver {driver_name!r} "
        "cannot read sharded checkpoints (reads_state_shards=False). Merge the weights into one file with "
        "`drivetrain export` and load that with load_model()."
    )
