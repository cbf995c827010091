"""Nested state (dicts, lists, tensors, numbers) split into JSON plus a flat tensor dict, and back.

Optimizer, scheduler and callback states are nested Python structures holding
framework tensors. Tensors go to a safetensors file under path-like keys; the rest
becomes JSON with typed markers for what JSON cannot say (tuples, non-string dict
keys, small numpy arrays, bytes). Nothing here ever unpickles.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from .._common import DrivetrainError

TENSOR = "__tensor__"
TUPLE = "__tuple__"
ITEMS = "__items__"
NDARRAY = "__ndarray__"
BYTES = "__bytes__"
MARKERS = (TENSOR, TUPLE, ITEMS, NDARRAY, BYTES)


class StateEncodingError(DrivetrainError, TypeError):
    """A state holds a value that cannot be stored without pickle."""


def split_state(state: Any, is_tensor: Callable[[Any], bool], prefix: str) -> tuple[Any, dict[str, Any]]:
    """Return (JSON-able skeleton, ``{key: tensor}``); keys start with ``prefix``."""
    tensors: dict[str, Any] = {}

    def encode(value: Any, path: str) -> Any:
        if is_tensor(value):
            tensors[path] = value
            return {TENSOR: path}
        if value is None or isinstance(value, (bool, str)):
            return value
        if isinstance(value, (int, float)):
            return value
        if isinstance(value, np.generic):
            return value.item()
        if isinstance(value, np.ndarray):
            return {NDARRAY: value.tolist(), "dtype": value.dtype.str, "shape": list(value.shape)}
        if isinstance(value, bytes):
            return {BYTES: base64.b64encode(value).decode("ascii")}
        if isinstance(value, tuple):
            return {TUPLE: [encode(v, f"{path}/{i}") for i, v in enumerate(value)]}
        if isinstance(value, list):
            return [encode(v, f"{path}/{i}") for i, v in enumerate(value)]
        if isinstance(value, Mapping):
            if all(isinstance(k, str) for k in value) and not any(k in MARKERS for k in value):
                return {k: encode(v, f"{path}/{k}") for k, v in value.items()}
            return {ITEMS: [[encode(k, f"{path}/key{i}"), encode(v, f"{path}/{k}")]
                            for i, (k, v) in enumerate(value.items())]}
        raise StateEncodingError(
            f"state entry {path!r} is a {type(value).__module__}.{type(value).__qualname__}, which cannot be "
            "stored without pickle; keep states to numbers, strings, lists, dicts, numpy arrays and tensors "
            "(or save with allow_pickle=True if you trust every reader)."
        )

    return encode(state, prefix), tensors


def join_state(skeleton: Any, tensors: Mapping[str, Any]) -> Any:
    """Inverse of :func:`split_state`."""

    def decode(value: Any) -> Any:
        if isinstance(value, list):
            return [decode(v) for v in value]
        if not isinstance(value, dict):
            return value
        if TENSOR in value:
            key = value[TENSOR]
            if key not in tensors:
                raise DrivetrainError(f"checkpoint state refers to tensor {key!r}, which the tensor file lacks.")
            return tensors[key]
        if TUPLE in value:
            return tuple(decode(v) for v in value[TUPLE])
        if ITEMS in value:
            return {_hashable(decode(k)): decode(v) for k, v in value[ITEMS]}
        if NDARRAY in value:
            return np.array(value[NDARRAY], dtype=np.dtype(value["dtype"])).reshape(value["shape"])
        if BYTES in value:
            return base64.b64decode(value[BYTES])
        return {k: decode(v) for k, v in value.items()}

    return decode(skeleton)


def _hashable(key: Any) -> Any:
    return tuple(key) if isinstance(key, list) else key
