"""A LoRA adapter folder folded into its base model's weights, from the files alone (``drivetrain export --base``).

Why: a LoRA run saves the adapter (drivetrain's ``model.safetensors`` of the trainable part, peft's
``adapter_config.json`` beside it), which needs the base to run; serving code wants one file of the
whole model that ``from_pretrained`` reads. peft's ``merge_and_unload`` does it with the model in memory;
here it is done framework-free from the adapter folder and the base's safetensors file(s):
``W + scale * B @ A`` (transposed where the layer stores ``(in, out)``: ``fan_in_fan_out``, GPT-2's Conv1D),
``scale = lora_alpha / r`` (``/ sqrt(r)`` with ``use_rslora``), ``r`` read from A's shape so per-module ranks
work. The base is checked against the adapter folder's fingerprint of its frozen parameters first:
another base is refused. LoRA on 2-D weights only; other adapters (DoRA, embeddings, convolutions,
``alpha_pattern``) are refused with the route that handles them (``save_model(folder, merge_adapters=True)``).
"""

from __future__ import annotations

import functools
import json
import math
import mmap
import os
import re
from collections.abc import Callable
from typing import Any

import numpy as np

from .._format import CheckpointError, safetensors_writer, verified_file
from .frozen import box_checksum

ADAPTER_CONFIG = "adapter_config.json"
_PREFIX = "base_model.model."
_LORA = re.compile(r"^base_model\.model\.(?P<module>.+)\.lora_(?P<part>[AB])\.(?P<adapter>[^.]+)\.weight$")

Reader = Callable[[str, memoryview], tuple[list[safetensors_writer.TensorEntry], dict[str, str]]]


def merged_entries(folder: str, manifest: dict[str, Any], base: str, read_entries: Reader,
                   keep_open: list[Any]) -> list[safetensors_writer.TensorEntry]:
    """The base's tensors, in its own names, with the adapter of ``folder`` folded in (computed when written)."""
    config = _adapter_config(folder, manifest)
    adapter = {name: (dtype, shape, view) for name, dtype, shape, view in _open(
        os.path.join(folder, "model.safetensors"), read_entries, keep_open)}
    base_tensors = {name: (dtype, shape, view) for path in _base_files(base)
                    for name, dtype, shape, view in _open(path, read_entries, keep_open)}
    pairs, replaced = _split_adapter(adapter, base_tensors, folder, base)
    _check_base(manifest.get("frozen") or {}, base_tensors, folder, base)
    scaling = _scaling(config)
    transposed = bool(config.get("fan_in_fan_out", False))
    entries: list[safetensors_writer.TensorEntry] = []
    for name in sorted(base_tensors):
        dtype, shape, view = replaced.get(name, base_tensors[name])
        if name in pairs:
            a, b = (_as_float32(*adapter[key]) for key in pairs[name])
            nbytes = math.prod(shape) * safetensors_writer.ITEM_SIZES[dtype]
            produce = _merger(dtype, shape, view, a, b, scaling(a.shape[0]), transposed)
            entries.append((name, dtype, shape, safetensors_writer.LazyBytes(nbytes, produce)))
        else:
            entries.append((name, dtype, shape, view))
    return entries


def _adapter_config(folder: str, manifest: dict[str, Any]) -> dict[str, Any]:
    record = manifest.get("files", {}).get(ADAPTER_CONFIG)
    if not isinstance(record, dict) or "model.safetensors" not in manifest.get("files", {}):
        raise CheckpointError(
            f"export --base: {folder} holds no LoRA adapter ({ADAPTER_CONFIG} and model.safetensors, as "
            "trainer.save_model writes for a peft model); pass the save_model folder of a LoRA run.")
    config = json.loads(verified_file(folder, ADAPTER_CONFIG, record))
    kind = config.get("peft_type")
    if kind != "LORA" or config.get("use_dora") or config.get("alpha_pattern"):
        what = "DoRA" if config.get("use_dora") else "alpha_pattern" if config.get("alpha_pattern") else kind
        raise CheckpointError(
            f"export --base merges plain LoRA adapters; {folder} holds {what}. Load the adapter onto its base and "
            "write trainer.save_model(DIR, merge_adapters=True), which merges with peft itself.")
    verified_file(folder, "model.safetensors", manifest["files"]["model.safetensors"], keep=False)
    return config


def _open(path: str, read_entries: Reader, keep_open: list[Any]) -> list[safetensors_writer.TensorEntry]:
    with open(path, "rb") as f:
        data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    keep_open.append(data)
    return read_entries(path, memoryview(data))[0]


def _base_files(base: str) -> list[str]:
    """The safetensors file(s) of the base: a file, a folder's model.safetensors, or the files its index lists."""
    path = os.path.abspath(base)
    if os.path.isfile(path):
        return [path]
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            files = sorted(set(json.load(f).get("weight_map", {}).values()))
        return [os.path.join(path, name) for name in files]
    if os.path.isfile(os.path.join(path, "model.safetensors")):
        return [os.path.join(path, "model.safetensors")]
    raise CheckpointError(f"export --base {base!r}: no such safetensors file, nor a folder holding model.safetensors "
                          "or model.safetensors.index.json (a from_pretrained folder of the base model).")


def _split_adapter(adapter: dict[str, Any], base: dict[str, Any], folder: str, where: str
                   ) -> tuple[dict[str, tuple[str, str]], dict[str, Any]]:
    """``({base weight name: (A key, B key)}, {base name: trained tensor replacing it})``."""
    parts: dict[str, dict[str, str]] = {}
    replaced: dict[str, Any] = {}
    unknown = []
    for key in adapter:
        match = _LORA.match(key)
        if match:
            parts.setdefault(f"{match['module']}.weight", {})[match["part"]] = key
            continue
        name = re.sub(r"\.modules_to_save\.[^.]+\.", ".", key.removeprefix(_PREFIX))
        if name in base:  # a trained copy (modules_to_save) or a buffer: it replaces the base's
            replaced[name] = adapter[key]
        else:
            unknown.append(name)
    missing = sorted(name for name in parts if name not in base or len(parts[name]) != 2)
    if missing or unknown:
        raise CheckpointError(
            f"export --base: the adapter in {folder} does not fit the base {where}: no base weight (or no A/B pair) "
            f"for {missing[:5]}, no base tensor for {unknown[:5]}. Pass the base model the adapter was trained on.")
    return {name: (found["A"], found["B"]) for name, found in parts.items()}, replaced


def _check_base(frozen: dict[str, Any], base: dict[str, Any], folder: str, where: str) -> None:
    """The base's tensors against the adapter folder's fingerprint of the frozen parameters it left out."""
    @functools.cache  # a tied weight's search reads the candidates again: each tensor is summed once
    def checksum_of(name: str) -> tuple[str, list[int], int]:
        dtype, shape, view = base[name]
        return dtype, list(shape), box_checksum(view, (0,) * len(shape), tuple(shape), list(shape))

    differ = []
    for name, described in frozen.get("tensors", {}).items():
        plain = name.removeprefix(_PREFIX).replace(".base_layer.", ".")
        if plain in base:
            if list(checksum_of(plain)) != list(described):
                differ.append(plain)
        elif not any(base[other][:2] == (described[0], tuple(described[1])) and list(checksum_of(other)) ==
                     list(described) for other in base):  # a tied weight the base file keeps once (lm_head)
            differ.append(plain)
    if differ:
        raise CheckpointError(
            f"export --base: {where} is not the base the adapter in {folder} was trained on: {len(differ)} frozen "
            f"tensor(s) are missing or differ ({differ[:5]}). Pass the same base weights.")


def _scaling(config: dict[str, Any]) -> Callable[[int], float]:
    alpha = float(config.get("lora_alpha", 8))
    if config.get("use_rslora"):
        return lambda r: alpha / math.sqrt(r)
    return lambda r: alpha / r


def _merger(dtype: str, shape: tuple[int, ...], view: Any, a: np.ndarray, b: np.ndarray, scale: float,
            transposed: bool) -> Callable[[], memoryview]:
    def produce() -> memoryview:
        delta = (b @ a) * np.float32(scale)
        merged = _as_float32(dtype, shape, view) + (delta.T if transposed else delta)
        return _from_float32(merged, dtype).reshape(-1).view(np.uint8).data
    return produce


def _as_float32(dtype: str, shape: tuple[int, ...], view: Any) -> np.ndarray:
    raw = np.frombuffer(view, dtype=f"<u{safetensors_writer.ITEM_SIZES[dtype]}").reshape(shape)
    if dtype == "BF16":
        return (raw.astype(np.uint32) << 16).view(np.float32)
    if dtype in ("F16", "F32", "F64"):
        return raw.view({"F16": np.float16, "F32": np.float32, "F64": np.float64}[dtype]).astype(np.float32)
    raise CheckpointError(f"export --base: a LoRA target weight stored as {dtype} cannot be merged (F32, F16, BF16).")


def _from_float32(values: np.ndarray, dtype: str) -> np.ndarray:
    values = np.ascontiguousarray(values, dtype=np.float32)
    if dtype == "BF16":  # round to nearest even, as torch's conversion does
        bits = values.view(np.uint32)
        return ((bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16).astype(np.uint16)
    return values.astype({"F16": np.float16, "F32": np.float32, "F64": np.float64}[dtype])
