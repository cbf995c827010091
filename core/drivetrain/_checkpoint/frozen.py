"""Frozen parameters in checkpoints: written once with the base model, not into every checkpoint.

A model whose parameters partly do not train (a LoRA adapter on a frozen base, a frozen encoder)
changes only in its trainable part. Checkpoints and ``save_model`` folders keep that part, every
buffer, and a *fingerprint* of the frozen parameters in the manifest (``frozen``: each one's dtype
and shape, and a CRC-32 of all their bytes); loading takes the frozen values from the model being
loaded into after checking them against the fingerprint, so a resume onto another base (other
weights, another architecture, another dtype) is refused, never silently mixed.

The driver says which parameters are frozen (``Driver.frozen_parameter_names``: ``requires_grad``,
``stop_gradient``, ``stop_grad``); ``save_frozen=True`` writes them too (a standalone model file).
The fingerprint reads the frozen bytes once per driver and set of names (they do not change while
training), and once per load.
"""

from __future__ import annotations

import weakref
import zlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from .._driver import Driver
from .folder import CheckpointError

FROZEN_KEY = "frozen"
"""The manifest's record of the frozen parameters a folder does not hold."""

_cache: weakref.WeakKeyDictionary[Driver, tuple[tuple[str, ...], dict[str, Any]]] = weakref.WeakKeyDictionary()


def split_frozen(driver: Driver, state: Mapping[str, Any], save_frozen: bool) -> tuple[dict[str, Any], dict | None]:
    """``(the tensors to write, the manifest record of those left out)``; the record is None when nothing is
    left out (no frozen parameter, or ``save_frozen``)."""
    names = () if save_frozen else tuple(sorted(set(driver.frozen_parameter_names()) & set(state)))
    if not names:
        return dict(state), None
    cached = _cache.get(driver)
    if cached is None or cached[0] != names:
        cached = names, fingerprint(driver, {name: state[name] for name in names})
        _cache[driver] = cached
    return {k: v for k, v in state.items() if k not in cached[1]["tensors"]}, cached[1]


def fingerprint(driver: Driver, tensors: Mapping[str, Any]) -> dict[str, Any]:
    """``{"tensors": {name: [dtype, shape]}, "bytes": total, "crc32": of names and bytes in name order}``."""
    crc, total, described = 0, 0, {}
    for name in sorted(tensors):
        dtype, shape, data = _bytes_of(driver, tensors[name])
        described[name] = [dtype, list(shape)]
        crc = zlib.crc32(data, zlib.crc32(name.encode(), crc))
        total += len(data)
    return {"tensors": described, "bytes": total, "crc32": crc}


def _bytes_of(driver: Driver, tensor: Any) -> tuple[str, tuple[int, ...], memoryview]:
    if type(driver).tensor_buffer is not Driver.tensor_buffer:
        dtype, shape, data = driver.tensor_buffer(tensor)
        return dtype, tuple(shape), memoryview(data).cast("B")
    array = np.ascontiguousarray(driver.tensor_to_numpy(tensor))
    return array.dtype.str, tuple(array.shape), memoryview(array.tobytes())


def complete_with_frozen(driver: Driver, saved: Mapping[str, Any], record: Mapping[str, Any] | None,
                         where: str) -> dict[str, Any]:
    """``saved`` plus the frozen tensors the folder left out, taken from the model being loaded into once they
    match the folder's fingerprint; ``saved`` as it is when the folder left nothing out."""
    if not record:
        return dict(saved)
    described = record.get("tensors", {})
    current = driver.model_state()
    missing = sorted(name for name in described if name not in current)
    if missing:
        raise CheckpointError(
            f"{where} was saved without its {len(described)} frozen parameter(s), to be taken from the model it is "
            f"loaded into, but this model has no {missing[:5]}: build the same base model (with the same frozen "
            "layers) before loading, or load a folder saved with save_frozen=True.")
    mine = fingerprint(driver, {name: current[name] for name in described})
    if mine != dict(record):
        differ = [name for name in described if mine["tensors"][name] != described[name]]
        what = (f"dtypes or shapes differ for {differ[:5]} (saved {[described[n] for n in differ[:5]]}, this model "
                f"{[mine['tensors'][n] for n in differ[:5]]})" if differ else
                "their values differ (another base checkpoint, or the base was changed after loading)")
        raise CheckpointError(
            f"{where} was saved without its {len(described)} frozen parameter(s) ({record.get('bytes', 0)} bytes), "
            f"to be taken from the model it is loaded into, but this model's frozen parameters are not the ones it "
            f"was trained on: {what}. Load the same base weights first (e.g. from_pretrained of the same "
            "checkpoint), or load a folder saved with save_frozen=True. Nothing was loaded.")
    return {**{name: current[name] for name in described}, **saved}
