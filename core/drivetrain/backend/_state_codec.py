"""The framework-free half of a backend's state module: tensor files, tensors from checkpoints, gradients.

Every backend turns checkpoint values into its tensors, hands tensor bytes to the
safetensors writer, parses safetensors bytes back and copies gradients to the host.
The rules and error messages of those steps are the same everywhere; the framework's
own calls are passed in (``from_numpy``, ``host_copy``, ...). Reading parses nothing
itself: a backend hands over what ``safetensors.deserialize`` returned.

bfloat16: numpy has no such dtype. A bf16 value is the upper half of a float32 with
the same value, so :func:`bf16_bits` and :func:`bf16_widened` convert exactly between
a float32 array and the bf16 bits a file holds.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from .._common import DriverError
from .._format import NUMPY_TAGS

_NUMPY_DTYPES = {tag: dtype for dtype, tag in NUMPY_TAGS.items()}
"""safetensors tag -> numpy dtype, for the tags numpy has a dtype for."""
_DTYPE_NAMES = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16", "complex64": "C64",
                "int64": "I64", "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL",
                "uint64": "U64", "uint32": "U32", "uint16": "U16", "float8_e4m3fn": "F8_E4M3",
                "float8_e5m2": "F8_E5M2", "float8_e4m3fnuz": "F8_E4M3FNUZ", "float8_e5m2fnuz": "F8_E5M2FNUZ",
                "float8_e8m0fnu": "F8_E8M0"}
"""A framework's dtype attribute name -> the safetensors tag of that dtype (torch, paddle and oneflow agree)."""


def dtype_tags(framework: Any, names: Iterable[str] | None = None) -> dict[Any, str]:
    """``{framework dtype: safetensors tag}`` for the dtypes ``framework`` has (``torch.float32``: "F32"), among
    ``names`` (default: every dtype safetensors stores), for :func:`file_dtype_tag` and reading files back."""
    chosen = _DTYPE_NAMES if names is None else {name: _DTYPE_NAMES[name] for name in names}
    return {getattr(framework, name): tag for name, tag in chosen.items() if hasattr(framework, name)}


def tensor_from(value: Any, where: str, *, tensor_type: Any, from_numpy: Callable[[np.ndarray], Any],
                framework: str, noun: str = "tensors") -> Any:
    """``value`` as a framework tensor: a tensor as is, a numpy array through ``from_numpy`` (C-contiguous).

    Checkpoints may hold either. Anything else is refused, naming ``where`` and what the
    ``framework`` driver needs (``noun``: "tensors", "Vars").
    """
    if isinstance(value, tensor_type):
        return value
    if isinstance(value, np.ndarray):
        return from_numpy(np.ascontiguousarray(value))
    raise DriverError(
        f"{where} is a {type(value).__name__}; the {framework} driver needs {framework} {noun} (or numpy arrays)."
    )


def check_file_tensor(tensor: Any, tensor_type: Any, noun: str) -> None:
    """Refuse a value that is not a ``tensor_type`` (``noun``: "a torch tensor") in a tensor file.

    The message starts with "is a": the checkpoint writer puts the value's name in front.
    """
    if not isinstance(tensor, tensor_type):
        raise DriverError(
            f"is a {type(tensor).__name__}, not {noun}; put only tensors in a tensor file "
            "(other values belong in the checkpoint's JSON manifest)."
        )


def file_dtype_tag(dtype: Any, tags: Mapping[Any, str], refusal: str = "safetensors cannot store") -> str:
    """The safetensors tag of a tensor's ``dtype``, or a DriverError ending with ``refusal``."""
    tag = tags.get(dtype)
    if tag is None:
        raise DriverError(f"has dtype {dtype}, which {refusal}.")
    return tag


def bf16_bits(array: np.ndarray) -> np.ndarray:
    """The bfloat16 bits (uint16) of float32 values that are exact bfloat16 values: their upper 16 bits."""
    return (np.ascontiguousarray(array, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)


def bf16_widened(bits: np.ndarray) -> np.ndarray:
    """The exact float32 values of bfloat16 ``bits`` (uint16)."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def safetensors_arrays(entries: Iterable[tuple[str, Mapping[str, Any]]], tags: Collection[str], refusal: str,
                       bits: Mapping[str, Any] | None = None) -> Iterator[tuple[str, str, np.ndarray]]:
    """``(name, dtype tag, array)`` for each tensor of a parsed safetensors file.

    ``entries`` is what ``safetensors.deserialize`` returns; ``tags`` are the dtype tags the
    backend loads, read as numpy's dtype of that tag, or as ``bits[tag]`` for dtypes numpy
    lacks (bf16 as a 16-bit integer). Another tag is refused with ``refusal`` ("the paddle
    driver cannot load"); a tensor whose bytes do not fit its shape too. Each array is a
    native, writable copy the framework can take over.
    """
    for name, info in entries:
        tag = info["dtype"]
        if tag not in tags:
            raise DriverError(f"tensor {name!r} has dtype {tag}, which {refusal}.")
        dtype = np.dtype((bits or {}).get(tag) or _NUMPY_DTYPES[tag])
        shape = [int(n) for n in info["shape"]]
        raw = info["data"]
        if len(raw) != math.prod(shape) * dtype.itemsize:
            raise DriverError(f"tensor {name!r}: {len(raw)} bytes do not fit dtype {tag} and shape {shape}.")
        yield name, tag, np.frombuffer(raw, dtype=dtype.newbyteorder("<")).reshape(shape).astype(dtype)


def widened_tensors(entries: Iterable[tuple[str, Mapping[str, Any]]], tags: Collection[str], refusal: str,
                    from_numpy: Callable[[np.ndarray], Any], to_bf16: Callable[[Any], Any]) -> dict[str, Any]:
    """``{name: tensor}`` of parsed safetensors ``entries`` (see :func:`safetensors_arrays`) for a framework whose
    numpy bridge has no bfloat16 (oneflow, jittor): each array becomes a tensor through ``from_numpy``; a bfloat16
    one is widened to its float32 values first and narrowed by ``to_bf16`` (both steps exact)."""
    out: dict[str, Any] = {}
    for name, tag, array in safetensors_arrays(entries, tags, refusal, {"BF16": np.uint16}):
        if tag == "BF16":
            out[name] = to_bf16(from_numpy(bf16_widened(array)))
        else:
            out[name] = from_numpy(array)
    return out


def gradient_copies(named_parameters: Iterable[tuple[str, Any]],
                    host_copy: Callable[[Any], Any | None]) -> dict[str, Any]:
    """``{name: host_copy(gradient)}`` over the parameters that have a gradient (``.grad`` not None).

    ``host_copy`` gets the detached gradient and returns a host copy of it, or None to
    leave the parameter out (a backend that keeps zeroed gradients leaves out zeros).
    """
    grads: dict[str, Any] = {}
    for name, param in named_parameters:
        if param.grad is None:
            continue
        copy = host_copy(param.grad.detach())
        if copy is not None:
            grads[name] = copy
    return grads


def check_optimizer_state(state: Any, where: str, keys: Sequence[str], framework: str) -> None:
    """Refuse a name-keyed optimizer state that is not a mapping holding ``keys``.

    For a backend whose ``optimizer_states()`` writes its own structure (not a framework
    ``state_dict``): anything else is most likely another driver's checkpoint.
    """
    if not isinstance(state, Mapping) or any(key not in state for key in keys):
        raise DriverError(
            f"{where} is a {type(state).__name__} without {'/'.join(repr(key) for key in keys)}; it must be what the "
            f"{framework} driver's optimizer_states() returned (a checkpoint of another driver cannot be loaded)."
        )
