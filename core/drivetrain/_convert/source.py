"""A model file of any framework, read without one: its tensors as raw entries, its layout and module classes.

A folder written by ``save_model``/``save_checkpoint`` is verified against its manifest first; a
bare ``.safetensors`` file (``drivetrain export``) carries the same facts in its metadata. The
tensors stay in a read-only memory map until :meth:`SourceWeights.close`.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from dataclasses import dataclass, field
from typing import Any

from .._common import ConfigurationError
from .._format import FROZEN_KEY, CheckpointError, is_sharded, read_entries, read_manifest, verified_file
from ..backend import WeightLayout, install_hint
from .engine import Tensor
from .record import CLASSES_KEY, LAYOUT_KEY, declared_layout, recorded_classes

MODEL_FILE = "model.safetensors"
DRIVER_KEY = "drivetrain_driver"
"""The metadata key of an exported file naming the driver that wrote it."""


@dataclass
class SourceWeights:
    """The tensors of a model file, the driver format that wrote it, its layout and its module classes."""

    where: str
    driver: str
    layout: WeightLayout
    classes: dict[str, tuple[str, ...]] | None
    tensors: dict[str, Tensor] = field(default_factory=dict)
    _map: Any = None

    def close(self) -> None:
        """Release the memory map (views still held elsewhere keep it until they go)."""
        self.tensors = {}
        try:
            if self._map is not None:
                self._map.close()
        except BufferError:
            pass


def written_by(path: str) -> str | None:
    """The driver format that wrote the model folder or file ``path``; None for a file that does not say."""
    if os.path.isdir(path):
        return read_manifest(os.path.abspath(path)).get("driver")
    try:
        with open(path, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(min(length, 100 << 20)))
    except (OSError, ValueError, struct.error):
        return None  # not readable as safetensors: the driver's own reader says why
    metadata = header.get("__metadata__") if isinstance(header, dict) else None
    return metadata.get(DRIVER_KEY) if isinstance(metadata, dict) else None


def open_source(path: str, source_driver: str | None = None) -> SourceWeights:
    """Read the model folder or exported file ``path`` (checksums verified first) without any framework.

    ``source_driver`` names the driver whose layout a file without drivetrain's metadata is in (a Hugging Face
    ``model.safetensors`` is torch's); a folder or file that records its driver must record that one.
    """
    if os.path.isdir(path):
        folder = os.path.abspath(path)
        record = read_manifest(folder)
        _refuse_partial(folder, record)
        entry = record["files"].get(MODEL_FILE)
        if not isinstance(entry, dict):
            raise CheckpointError(f"{folder}: the manifest lists no {MODEL_FILE}; this folder holds no model weights.")
        verified_file(folder, MODEL_FILE, entry, keep=False)
        file, driver = os.path.join(folder, MODEL_FILE), str(record.get("driver"))
    else:
        file, record, driver = os.path.abspath(path), {}, ""
    with open(file, "rb") as f:
        data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    entries, metadata = read_entries(file, memoryview(data))
    named = False
    if not record:
        driver = metadata.get(DRIVER_KEY, "")
        named, driver = not driver and bool(source_driver), driver or source_driver or ""
        record = {LAYOUT_KEY: _json(metadata.get(LAYOUT_KEY)), CLASSES_KEY: metadata.get(CLASSES_KEY)}
    try:
        check_source_driver(path, source_driver, driver)
    except ConfigurationError:
        data.close()
        raise
    tensors = {name: Tensor(dtype, tuple(shape), view, name) for name, dtype, shape, view in entries}
    return SourceWeights(path, driver, _layout(record, driver, path, named), recorded_classes(record), tensors, data)


def check_source_driver(where: str, source_driver: str | None, recorded: str | None) -> None:
    """``source_driver`` is a driver name and agrees with the driver ``where`` records, if it records one."""
    if source_driver is None:
        return
    if not isinstance(source_driver, str) or not source_driver:
        raise ConfigurationError(f"source_driver={source_driver!r} is not accepted; pass the name of the driver whose "
                                 "layout the file is in, such as 'torch' (a Hugging Face model.safetensors).")
    if recorded and recorded != source_driver:
        raise ConfigurationError(f"source_driver={source_driver!r}, but {where} records that driver {recorded!r} wrote "
                                 "it; drop source_driver (it is for files that do not say).")


def _json(text: Any) -> Any:
    try:
        return json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return None


def _layout(record: dict[str, Any], driver: str, where: str, named: bool) -> WeightLayout:
    """The layout the file records, else the one its driver's installed backend declares (``named``: the user
    named that driver with ``source_driver``)."""
    if record.get(LAYOUT_KEY) is not None:
        return WeightLayout.from_json(record[LAYOUT_KEY], where)
    declared = declared_layout(driver)
    if declared is None and not driver:
        raise CheckpointError(
            f"{where} does not say which framework's layout it is in (no drivetrain metadata); name it: "
            "source_driver='torch' for a Hugging Face or other torch file (drivetrain convert --from torch).")
    if declared is None and named:
        raise CheckpointError(f"{where}: source_driver={driver!r} names no installed driver, so its layout is "
                              f"unknown here; install its backend ({install_hint(driver)}) or name another driver.")
    if declared is None:
        raise CheckpointError(
            f"{where} was written by driver {driver!r} (drivetrain before weight layouts were recorded), whose "
            f"backend is not installed here, so how its files differ from other frameworks' is unknown. Install it "
            f"({install_hint(driver)}), or load and save the folder again with a current drivetrain.")
    return declared


def _refuse_partial(folder: str, manifest: dict[str, Any]) -> None:
    """Folders that do not hold the whole model in one file cannot move to another framework as they are."""
    if is_sharded(manifest):
        raise CheckpointError(f"{folder} is a sharded checkpoint; merge it into one file first (drivetrain export "
                              f"{folder} -o model.safetensors), then load that file.")
    if manifest.get(FROZEN_KEY):
        raise CheckpointError(f"{folder} holds the trainable parameters only (its frozen ones were left out); load it "
                              "in the framework that wrote it and save_model(DIR, save_frozen=True) to move it.")
