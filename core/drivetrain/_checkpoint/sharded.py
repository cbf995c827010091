"""Sharded checkpoints: every rank writes its own pieces of the model and optimizer state, in parallel.

Why: a driver that shards the model over the processes (FSDP, ZeRO) would otherwise gather
everything into rank 0's memory and write it from one process; here nothing is gathered and
the write takes as long as the largest piece. The folder keeps every promise of the format:
built under a temporary name and renamed into place once complete, a sha256 per file in the
manifest, tensors in safetensors and everything else in JSON.

Files beside the usual ``training_state.*`` (which rank 0 writes as for any checkpoint):

- ``shards-<rank>-of-<world>.safetensors``: the pieces that rank holds, each under its
  state key (``model/<parameter name>`` for weights; the driver names the rest), or
  ``<key>#<i>`` when the rank gave several boxes for one key;
- ``shards.json``: per key its dtype, full shape and chunks (file, offsets, sizes, and the
  name in the file when it is not the key), and
  the driver's plain-data ``meta`` (e.g. optimizer hyper-parameters) in the JSON codec.

Loading plans, per key and per reading rank, which stored chunks overlap the piece the
rank needs (:meth:`ShardSource.reads`), so a checkpoint written by N ranks loads at any
world size and into unsharded drivers: resharding is only a different set of slices.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .._common import DriverError
from .._format import (
    FROZEN_KEY,
    LAYOUT_FILE,
    MODEL_PREFIX,
    CheckpointError,
    FileContent,
    LoadedCheckpoint,
    ShardPiece,
    ShardSource,
    StateEncodingError,
    StateShards,
    cannot_read_shards,
    finish_checkpoint,
    join_state,
    layout_chunks,
    shard_files,
    split_state,
    temp_name,
    verified_file,
)
from .._format import write_files as _write_files
from ..backend import Driver
from .background import HostBuffers, PendingSave, host_copy
from .frozen import cached_sums, check_frozen, combine, frozen_names


def load_shards(driver: Driver, source: ShardSource, *, optimizers: bool, frozen: Mapping[str, Any] | None = None
                ) -> None:
    """``driver.load_state_shards`` where the driver declares it reads them, else the error saying what to do;
    every rank. ``frozen``: the checkpoint's record of the frozen parameters it left out, checked against the
    model first."""
    if not driver.reads_state_shards:
        raise cannot_read_shards(driver.name, source)
    if frozen:
        check_frozen(driver, frozen, lambda: _frozen_pieces(driver, frozen["tensors"]), source.folder,
                     gather=driver.shards_state)
    driver.load_state_shards(source, optimizers=optimizers)


def _frozen_pieces(driver: Driver, names: Iterable[str]) -> dict[str, list[tuple[Any, tuple, tuple]]]:
    """The pieces of the frozen parameters ``names`` this rank holds: its shards for a sharding driver, the
    whole tensors otherwise (every rank of an unsharded run holds them all)."""
    if not driver.shards_state:
        state = driver.model_state()
        return {n: [(state[n], (), ())] for n in names if n in state}
    pieces = driver.state_shards(optimizers=False).pieces
    return {n: _as_list(pieces[MODEL_PREFIX + n]) for n in names if MODEL_PREFIX + n in pieces}


def _as_list(given: ShardPiece | list[ShardPiece]) -> list[tuple[Any, tuple, tuple]]:
    return [(p.tensor, p.offsets, p.shape) for p in ([given] if isinstance(given, ShardPiece) else given)]


def shard_file(rank: int, world_size: int) -> str:
    return f"shards-{rank:05d}-of-{world_size:05d}.safetensors"


# ----------------------------------------------------------------------------------------- writing
def write_sharded_checkpoint(driver: Driver, folder: str,
                             rank0_files: Callable[[], tuple[dict[str, FileContent], dict[str, Any]]], *,
                             optimizers: bool, save_frozen: bool = False) -> None:
    """Every rank: write this rank's shards (``driver.state_shards(optimizers=...)``: without the optimizer
    states for a model-only save) and, on rank 0, ``rank0_files()`` (the other files and the manifest's
    fields) into one temporary folder, then rename it to ``folder``. Frozen parameters are left out, their
    fingerprint kept in the manifest, unless ``save_frozen`` (see :mod:`.frozen`).

    The ranks agree on the outcome: when any rank fails, the temporary folder is removed, the
    previous checkpoint under ``folder`` stays as it was, and every rank raises naming the rank.
    """
    job = _prepare_shards(driver, folder, rank0_files, optimizers, save_frozen, copy=False)
    records: dict[str, Any] = {}
    error = job.error
    if error is None:
        try:
            records = _write_shards(job)
        except Exception as exc:  # reported to every rank by the commit, so none waits for the others forever
            error = exc
    _commit_shards(driver, job, records, error)


def start_sharded_checkpoint(driver: Driver, folder: str,
                             rank0_files: Callable[[], tuple[dict[str, FileContent], dict[str, Any]]], *,
                             optimizers: bool, save_frozen: bool = False,
                             buffers: HostBuffers | None = None) -> PendingSave:
    """:func:`write_sharded_checkpoint` with the files written by a worker thread: every rank copies its
    shards (and rank 0 its other files) to host memory (``buffers``) and returns; :meth:`PendingSave.finish`
    (every rank, main thread) gathers the outcome and renames the folder into place on rank 0."""
    job = _prepare_shards(driver, folder, rank0_files, optimizers, save_frozen, copy=True, buffers=buffers)
    return PendingSave(driver, folder, lambda: _write_shards(job),
                       lambda records, error: _commit_shards(driver, job, records or {}, error))


@dataclass
class _ShardJob:
    """One rank's part of a sharded save, prepared on the main thread: its files and what the commit merges."""

    folder: str
    tmp: str
    files: dict[str, FileContent] = field(default_factory=dict)
    layout: list[dict[str, Any]] = field(default_factory=list)
    sums: dict[str, tuple] = field(default_factory=dict)
    manifest: dict[str, Any] = field(default_factory=dict)
    meta: Any = None
    error: Exception | None = None


def _prepare_shards(driver: Driver, folder: str,
                    rank0_files: Callable[[], tuple[dict[str, FileContent], dict[str, Any]]], optimizers: bool,
                    save_frozen: bool, copy: bool, buffers: HostBuffers | None = None) -> _ShardJob:
    """Every rank, main thread (it agrees on the temporary folder): this rank's files, copied to memory of
    their own when ``copy`` (a background write). A failure is kept in ``error`` for the commit to share."""
    rank, world = driver.rank, driver.world_size
    job = _ShardJob(folder, driver.broadcast_object(temp_name(folder) if rank == 0 else None))
    try:
        shards = driver.state_shards(optimizers=optimizers)
        job.sums = _leave_out_frozen(driver, shards, save_frozen)
        name = shard_file(rank, world)
        stored = shards.stored()
        content = driver.tensor_file({file_key: piece.tensor for file_key, (_, piece) in stored.items()})
        job.layout = _piece_layout(name, stored, _dtypes_and_shapes(content))
        mine: dict[str, FileContent] = {name: content}
        if rank == 0:
            files, job.manifest = rank0_files()
            mine.update(files)
            job.meta = _encode_meta(shards.meta)
        job.files = host_copy(mine, buffers) if copy else mine
    except Exception as exc:  # reported to every rank by the commit, so none waits for the others forever
        job.error = exc
    return job


def _write_shards(job: _ShardJob) -> dict[str, Any]:
    """This rank's files into the temporary folder; their manifest records. No collective: a background save
    runs it on a worker thread."""
    if job.error is not None:
        raise job.error
    files, job.files = job.files, {}  # the host copy goes once written
    os.makedirs(job.tmp, exist_ok=True)
    return _write_files(job.folder, job.tmp, files)


def _commit_shards(driver: Driver, job: _ShardJob, records: dict[str, Any], error: BaseException | None) -> None:
    """Every rank, main thread: gather every rank's records and errors; rank 0 writes the manifest and renames
    the folder into place (or removes it when any rank failed); every rank raises the same failure."""
    message = None if error is None else f"{type(error).__name__}: {error}"
    gathered = driver.all_gather_object((records, job.layout, message, job.sums))
    failed = [(r, e) for r, (_, _, e, _) in enumerate(gathered) if e is not None]
    outcome = None
    if driver.rank == 0:
        manifest = job.manifest
        frozen = [s for *_, s in gathered if s]
        if frozen:
            manifest = dict(manifest, **{FROZEN_KEY: combine(frozen)})
        outcome = _first_failure(failed, job.folder) or _finish(job.folder, job.tmp, gathered, manifest, job.meta,
                                                                 driver.world_size)
        if outcome is not None:
            shutil.rmtree(job.tmp, ignore_errors=True)
    outcome = driver.broadcast_object(outcome)  # every rank leaves together, the folder already tidied
    if outcome is not None:
        raise CheckpointError(outcome) from error


def _leave_out_frozen(driver: Driver, shards: StateShards, save_frozen: bool) -> dict[str, tuple]:
    """Remove the frozen parameters' pieces from ``shards``; return this rank's checksums of them."""
    model_names = [key[len(MODEL_PREFIX):] for key in shards.pieces if key.startswith(MODEL_PREFIX)]
    names = frozen_names(driver, model_names, save_frozen)
    if not names:
        return {}
    sums = cached_sums(driver, names, lambda: {n: _as_list(shards.pieces[MODEL_PREFIX + n]) for n in names})
    for name in names:
        del shards.pieces[MODEL_PREFIX + name]
    return sums


def _first_failure(failed: list[tuple[int, str]], folder: str) -> str | None:
    if not failed:
        return None
    rank, error = failed[0]
    return (f"could not write the sharded checkpoint {folder}: rank {rank} failed ({error}); the previous "
            "checkpoint under this name, if any, is unchanged.")


def _finish(folder: str, tmp: str, gathered: list[tuple[dict, list, str | None, dict]], manifest: dict[str, Any],
            meta: Any, world: int) -> str | None:
    """Rank 0: merge the ranks' layouts and records, check every file arrived, write the manifest, rename."""
    try:
        records: dict[str, Any] = {}
        tensors: dict[str, Any] = {}
        for rank_records, rank_layout, *_ in gathered:
            records.update(rank_records)
            _merge_layout(tensors, rank_layout)
        for name, record in records.items():
            path = os.path.join(tmp, name)
            if not os.path.isfile(path) or os.path.getsize(path) != record["size"]:
                return (f"could not write the sharded checkpoint {folder}: {name} did not arrive in {tmp}; every "
                        "rank must write to a folder on a file system all of them share (e.g. NFS on several "
                        "machines). The previous checkpoint, if any, is unchanged.")
        layout_bytes = json.dumps({"tensors": tensors, "meta": meta}, sort_keys=True).encode()
        records.update(_write_files(folder, tmp, {LAYOUT_FILE: layout_bytes}))
        shard_files = [shard_file(r, world) for r in range(world)]
        finish_checkpoint(folder, tmp, records, dict(manifest, sharded={
            "world_size": world, "layout": LAYOUT_FILE, "files": shard_files}))
    except Exception as exc:
        return f"could not write the sharded checkpoint {folder}: {type(exc).__name__}: {exc}"
    return None


def _dtypes_and_shapes(content: FileContent) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Each tensor's safetensors dtype and shape, from the streamed entries or the encoded bytes."""
    if isinstance(content, (bytes, bytearray)):
        length = int.from_bytes(content[:8], "little")
        header = json.loads(bytes(content[8:8 + length]))
        header.pop("__metadata__", None)
        return {name: (info["dtype"], tuple(info["shape"])) for name, info in header.items()}
    return {name: (dtype, tuple(shape)) for name, dtype, shape, _ in content}


def _piece_layout(file: str, pieces: Mapping[str, tuple[str, ShardPiece]],
                  stored: Mapping[str, tuple[str, tuple[int, ...]]]) -> list[dict[str, Any]]:
    """One record per stored piece: its state key, where it sits in the full tensor, and its name in ``file``."""
    layout = []
    for file_key, (key, piece) in pieces.items():
        dtype, sizes = stored[file_key]
        offsets, shape = tuple(int(o) for o in piece.offsets), tuple(int(n) for n in piece.shape)
        if len(offsets) != len(shape) or len(sizes) != len(shape) or any(
                o < 0 or o + s > n for o, s, n in zip(offsets, sizes, shape, strict=True)):
            raise DriverError(f"state_shards(): the piece {file_key!r} (offsets {list(offsets)}, sizes "
                              f"{list(sizes)}) does not fit its full shape {list(shape)}.")
        record = {"state_key": key, "file": file, "dtype": dtype, "shape": list(shape), "offsets": list(offsets),
                  "sizes": list(sizes)}
        if file_key != key:
            record["key"] = file_key
        layout.append(record)
    return layout


def _merge_layout(tensors: dict[str, Any], rank_layout: list[dict[str, Any]]) -> None:
    for piece in rank_layout:
        key = piece["state_key"]
        entry = tensors.setdefault(key, {"dtype": piece["dtype"], "shape": piece["shape"], "chunks": []})
        if entry["dtype"] != piece["dtype"] or entry["shape"] != piece["shape"]:
            raise DriverError(f"state_shards(): the ranks disagree on {key!r}: {entry['dtype']} {entry['shape']} "
                              f"vs {piece['dtype']} {piece['shape']}.")
        chunk = {"file": piece["file"], "offsets": piece["offsets"], "sizes": piece["sizes"]}
        if "key" in piece:
            chunk["key"] = piece["key"]
        entry["chunks"].append(chunk)


def _encode_meta(meta: Any) -> Any:
    try:
        skeleton, _ = split_state(meta, lambda _: False, "meta")
    except StateEncodingError as exc:
        raise DriverError(f"state_shards(): meta must be plain data: {exc}") from None
    return skeleton


# ----------------------------------------------------------------------------------------- reading
def open_shards(driver: Driver, loaded: LoadedCheckpoint) -> ShardSource:
    """Every rank: verify the shard files (each rank hashes its share of them, in parallel), then parse the layout.

    ``loaded`` was read with ``skip_shards=True``: everything but the shard files is verified already.
    """
    manifest, folder = loaded.manifest, loaded.folder
    files = shard_files(manifest)
    mine = files[driver.rank::driver.world_size] if driver.is_distributed() else files
    error = None
    try:
        for name in mine:
            record = manifest["files"].get(name)
            if not isinstance(record, dict):
                raise CheckpointError(f"{folder}: the manifest lists no checksum for {name}; the checkpoint is "
                                      "incomplete.")
            verified_file(folder, name, record, keep=False)
    except CheckpointError as exc:
        error = str(exc)
    errors = [e for e in driver.all_gather_object(error)] if driver.is_distributed() else [error]
    bad = [e for e in errors if e is not None]
    if bad:
        raise CheckpointError(bad[0] + " Nothing was loaded.")
    return parse_layout(folder, manifest, loaded.files.get(manifest["sharded"].get("layout", LAYOUT_FILE)))


_HEADER_LIMIT = 100 << 20


def whole_file_source(path: str, frozen: Iterable[str] = ()) -> ShardSource:
    """A plain safetensors file of model weights (a ``model.safetensors``, an export, a Hugging Face file) seen
    as a sharded checkpoint one process wrote, so a sharding driver reads only the slices each rank keeps;
    ``frozen``: the frozen parameters its folder left out."""
    try:
        with open(path, "rb") as f:
            length = int.from_bytes(f.read(8), "little")
            if length > _HEADER_LIMIT:
                raise ValueError(f"header size {length} is implausible")
            header = json.loads(f.read(length))
        header.pop("__metadata__", None)
        layout = {MODEL_PREFIX + name: {"dtype": info["dtype"], "shape": list(info["shape"]), "chunks": [
            {"file": os.path.basename(path), "offsets": [0] * len(info["shape"]), "sizes": list(info["shape"]),
             "key": name}]} for name, info in header.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"{path} is not a readable safetensors file ({type(exc).__name__}: {exc}).") from exc
    return ShardSource(os.path.dirname(os.path.abspath(path)), layout, None, 1, frozen)


def parse_layout(folder: str, manifest: Mapping[str, Any], data: bytes | None) -> ShardSource:
    name = manifest["sharded"].get("layout", LAYOUT_FILE)
    if data is None:
        raise CheckpointError(f"{folder}: the manifest lists no {name}; the sharded checkpoint is incomplete.")
    try:
        body = json.loads(data)
        tensors, meta = body["tensors"], join_state(body["meta"], {})
        for entry in tensors.values():
            layout_chunks(entry)
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{folder}/{name} is damaged: {type(exc).__name__}: {exc}.") from exc
    frozen = (manifest.get(FROZEN_KEY) or {}).get("tensors", {})
    return ShardSource(folder, tensors, meta, int(manifest["sharded"].get("world_size", 0)), frozen)
