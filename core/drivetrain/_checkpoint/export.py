"""``export_weights``: the model of a checkpoint as one plain safetensors file, for inference elsewhere.

Why: a checkpoint folder holds the weights beside optimizer state and a manifest; a user
serving the model wants one file that ``model.load_state_dict(safetensors.torch.load_file(f))``
or Hugging Face's ``from_pretrained`` (on a folder with the config) reads. The model file of
every backend already uses the model's ``state_dict`` names, so exporting means: verify the
manifest and the file's sha256, check the safetensors header, and copy the tensors into a new
file written atomically. Framework-free (the header is parsed here, the data copied from a
memory map), so it works for every backend's checkpoints; nothing is ever unpickled.
"""

from __future__ import annotations

import functools
import json
import mmap
import os
from typing import Any

import numpy as np

from .._common import atomic_write
from .._convert import CLASSES_KEY, LAYOUT_KEY
from .._format import (
    FROZEN_KEY,
    MANIFEST,
    MODEL_PREFIX,
    CheckpointError,
    ShardRead,
    is_sharded,
    list_checkpoints,
    read_checkpoint,
    read_entries,
    read_manifest,
    safetensors_writer,
    verified_file,
)
from .merge_lora import merged_entries
from .sharded import parse_layout
from .training import MODEL_FILE

"""Largest safetensors header accepted (the format's own readers refuse larger ones too)."""


def export_weights(checkpoint: str | os.PathLike, out: str | os.PathLike, *,
                   base: str | os.PathLike | None = None) -> str:
    """Write the model weights of ``checkpoint`` as the single safetensors file ``out``; return its path.

    ``checkpoint`` is a folder written by ``Trainer.save_checkpoint``, ``CheckpointCallback`` or
    ``Trainer.save_model``, or a folder holding such checkpoints (the newest is taken). ``out`` is
    the file to write, or an existing folder (``model.safetensors`` is written inside it, the name
    ``from_pretrained`` looks for). Tensor names are the model's ``state_dict`` keys. The file's
    checksum is verified before anything is read; ``out`` is replaced only once complete.

    Args:
        checkpoint: a checkpoint or model folder, or a folder of checkpoints (the newest is taken).
        out: the ``.safetensors`` file to write, or an existing folder to write ``model.safetensors`` in.
        base: for the ``save_model`` folder of a LoRA adapter (peft), the base model's weights (a
            safetensors file, or a ``from_pretrained`` folder): the file written is the base with the
            adapter folded in, under the base's names (as peft's ``merge_and_unload``); the base is checked
            against the adapter folder's fingerprint of it first. None: the checkpoint's own weights.

    Returns:
        The path of the file written.

    Raises:
        CheckpointError: the checkpoint is damaged, a file, holds no model weights or left its frozen
            parameters out (the message says how to export it); or ``base`` does not fit the adapter.
        FileNotFoundError: ``checkpoint`` does not exist, or the folder ``out`` is to be written in does not.
        ValueError: ``out`` is the checkpoint's own model file.
    """
    folder = _checkpoint_folder(checkpoint)
    manifest = read_manifest(folder)
    target = _target(out)
    if base is not None:
        return _export_merged(folder, manifest, os.fspath(base), target)
    _refuse_frozen(folder, manifest)
    if is_sharded(manifest):
        entries = _merged_shards(folder)

        def write_merged(tmp: str) -> None:
            safetensors_writer.write_file(tmp, entries, _export_metadata(manifest, folder), durable=False)

        atomic_write(target, write_merged)
        return target
    source = os.path.join(folder, MODEL_FILE)
    _verify(folder, manifest)
    if os.path.exists(target) and os.path.samefile(target, source):
        raise ValueError(f"export_weights(out={os.fspath(out)!r}) is the checkpoint's own model file; "
                         "pass a path outside the checkpoint folder.")
    with open(source, "rb") as f:
        data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        entries, metadata = read_entries(source, memoryview(data))
        metadata = {**metadata, **_export_metadata(manifest, folder)}
        def write(tmp: str) -> None:
            safetensors_writer.write_file(tmp, entries, metadata, durable=False)

        atomic_write(target, write)
    finally:
        entries = []
        try:
            data.close()
        except BufferError:  # views still held by an exception's traceback: the map closes when they go
            pass
    return target


def _export_merged(folder: str, manifest: dict[str, Any], base: str, target: str) -> str:
    keep_open: list[Any] = []
    try:
        entries = merged_entries(folder, manifest, base, read_entries, keep_open)
        metadata = {**_export_metadata(manifest, folder), "drivetrain_merged_base": os.path.basename(base)}

        def write(tmp: str) -> None:
            safetensors_writer.write_file(tmp, entries, metadata, durable=False)

        atomic_write(target, write)
    finally:
        entries = []
        for data in keep_open:
            try:
                data.close()
            except BufferError:  # views still held by an exception's traceback: the map closes when they go
                pass
    return target


def _refuse_frozen(folder: str, manifest: dict[str, Any]) -> None:
    """A folder that left its frozen parameters out has no whole model to export: say how to get one."""
    frozen = manifest.get(FROZEN_KEY)
    if frozen:
        raise CheckpointError(
            f"{folder} holds the trainable parameters only: its {len(frozen.get('tensors', {}))} frozen ones "
            f"({frozen.get('bytes', 0)} bytes) were left out, to be taken from the base model when it is loaded. "
            "For one file with the whole model, load it into the model (trainer.load_model(folder), or "
            "run(resume_from=folder)) and write trainer.save_model(DIR, save_frozen=True); for a LoRA adapter, "
            "export_weights(folder, out, base=BASE) (drivetrain export --base BASE) folds it into its base's file.")


def _target(out: str | os.PathLike) -> str:
    """The file to write: ``out``, or ``model.safetensors`` inside it when it is a folder; its folder must exist."""
    target = os.path.abspath(os.fspath(out))
    if os.path.isdir(target):
        target = os.path.join(target, MODEL_FILE)
    if not os.path.isdir(os.path.dirname(target)):
        raise FileNotFoundError(f"export_weights(out={os.fspath(out)!r}): the folder {os.path.dirname(target)!r} "
                                "does not exist; create it first or pass another output path.")
    return target


def _merged_shards(folder: str) -> list[safetensors_writer.TensorEntry]:
    """The model tensors of a sharded checkpoint, each assembled from its ranks' chunks when the writer reaches
    it and dropped once written (:class:`~.safetensors_writer.LazyBytes`): one tensor in memory at a time.

    Every file's checksum is verified first. Chunks are copied as raw elements (an unsigned integer
    of the dtype's width), so every dtype, bf16 and float8 included, comes out bit-exact.
    """
    loaded = read_checkpoint(folder)  # verifies every shard file (streamed) and reads the small ones
    source = parse_layout(folder, loaded.manifest, loaded.files.get(loaded.manifest["sharded"].get("layout", "")))
    maps: dict[str, dict[str, safetensors_writer.TensorEntry]] = {}

    def merged(reads: list[ShardRead], dtype: str, shape: tuple[int, ...]) -> memoryview:
        width = np.dtype(f"u{safetensors_writer.ITEM_SIZES[dtype]}")
        tensor = np.zeros(shape, dtype=width)
        for read in reads:
            if read.path not in maps:
                with open(read.path, "rb") as f:
                    data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
                maps[read.path] = {e[0]: e for e in read_entries(read.path, memoryview(data))[0]}
            _, stored_dtype, stored_shape, view = maps[read.path][read.key]
            if stored_dtype != dtype:
                raise CheckpointError(f"{read.path}: {read.key!r} is stored as {stored_dtype}, the layout says {dtype}.")
            tensor[read.target] = np.frombuffer(view, dtype=width).reshape(stored_shape)[read.source]
        return tensor.reshape(-1).view(np.uint8).data

    entries = []
    for name in sorted(source.model_keys()):
        key = MODEL_PREFIX + name
        dtype, shape = source.dtype(key), source.shape(key)
        reads = source.reads(key, (0,) * len(shape), shape)  # a layout that does not cover it fails before writing
        nbytes = int(np.prod(shape, dtype=np.int64)) * safetensors_writer.ITEM_SIZES[dtype]
        produce = functools.partial(merged, reads, dtype, shape)
        entries.append((name, dtype, shape, safetensors_writer.LazyBytes(nbytes, produce)))
    return entries


def _checkpoint_folder(checkpoint: str | os.PathLike) -> str:
    """The checkpoint folder ``checkpoint`` names: itself, or the newest complete checkpoint inside it."""
    path = os.path.abspath(os.fspath(checkpoint))
    if not os.path.exists(path):
        raise FileNotFoundError(f"export_weights(checkpoint={os.fspath(checkpoint)!r}): no such file or folder; "
                                "pass a folder written by save_checkpoint, save_model or CheckpointCallback.")
    if os.path.isfile(path):
        raise CheckpointError(f"export_weights(checkpoint={os.fspath(checkpoint)!r}) is a file; pass the checkpoint "
                              f"folder that holds {MANIFEST} and {MODEL_FILE} (a bare .safetensors file is "
                              "already exported).")
    if os.path.isfile(os.path.join(path, MANIFEST)):
        return path
    found = [folder for folder, manifest in list_checkpoints(path)
             if MODEL_FILE in manifest.get("files", {}) or is_sharded(manifest)]
    if not found:
        raise CheckpointError(f"export_weights(checkpoint={os.fspath(checkpoint)!r}): {path} holds no {MANIFEST} "
                              "and no complete checkpoint folder; pass a folder written by save_checkpoint, "
                              "save_model or CheckpointCallback.")
    return found[-1]


def _verify(folder: str, manifest: dict[str, Any]) -> None:
    """Size and sha256 of the model file against the manifest, streamed (the weights may exceed memory)."""
    record = manifest["files"].get(MODEL_FILE)
    if not isinstance(record, dict):
        raise CheckpointError(f"{folder}: the manifest lists no {MODEL_FILE}; this checkpoint holds no model weights.")
    verified_file(folder, MODEL_FILE, record, keep=False)


def _export_metadata(manifest: dict[str, Any], folder: str) -> dict[str, str]:
    """What the exported file records: ``format`` ("pt" for torch, which ``from_pretrained`` requires) and origin."""
    driver = str(manifest.get("driver", ""))
    meta = {"drivetrain_driver": driver, "drivetrain_source": os.path.basename(folder)}
    meta.update({key: json.dumps(manifest[key], separators=(",", ":")) for key in (LAYOUT_KEY, CLASSES_KEY)
                 if key in manifest})  # how another framework reads it (drivetrain.load_weights)
    if driver == "torch":
        meta["format"] = "pt"
    return meta
