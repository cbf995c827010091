"""JAX arrays in drivetrain's files (safetensors, no pickle) and the model's random state.

64-bit is off by default in JAX: a 64-bit array read from a file stays a numpy array until it is loaded into a
variable of the model's own dtype. bfloat16 travels as its bits. PRNG key arrays cannot be written as they are:
their key data (uint32) and implementation name are, and are wrapped again on the way in.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import safetensors
from flax import nnx

from drivetrain.backend import (
    DriverError,
    array_buffer,
    check_file_tensor,
    check_rng_state_keys,
    safetensors_arrays,
)

TAGS = ("F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U64", "U32", "U16", "U8", "BOOL")
_WIDE = (np.dtype(np.float64), np.dtype(np.int64), np.dtype(np.uint64))


def is_key(value: Any) -> bool:
    """Whether ``value`` is a typed PRNG key array (``jax.random.key``)."""
    return isinstance(value, jax.Array) and jax.dtypes.issubdtype(value.dtype, jax.dtypes.prng_key)


def tensor_buffer(tensor: Any) -> tuple[str, tuple[int, ...], memoryview]:
    if not isinstance(tensor, np.ndarray):
        check_file_tensor(tensor, jax.Array, "a jax array")
        if is_key(tensor):
            raise DriverError("is a PRNG key array; write jax.random.key_data(key) instead (rng_state() does).")
    array = np.asarray(tensor)
    if array.dtype == jnp.bfloat16:
        return array_buffer(np.ascontiguousarray(array).view(np.uint16), "BF16")
    return array_buffer(array)


def tensors_from_bytes(data: bytes) -> dict[str, Any]:
    arrays = safetensors_arrays(safetensors.deserialize(data), TAGS, "the jax driver cannot load",
                                {"BF16": jnp.bfloat16})
    return {name: array if array.dtype in _WIDE and not jax.config.jax_enable_x64 else jnp.asarray(array)
            for name, _, array in arrays}


def placed(value: Any, like: Any, where: str) -> Any:
    """A loaded ``value`` (a jax or numpy array) as ``like``: its dtype, on its device; another shape is refused."""
    if not isinstance(value, (jax.Array, np.ndarray)):
        raise DriverError(f"{where} is a {type(value).__name__}; the jax driver needs jax or numpy arrays.")
    if tuple(value.shape) != tuple(like.shape):
        raise DriverError(f"{where} has shape {tuple(value.shape)} but the model's has shape {tuple(like.shape)}.")
    return jax.device_put(value.astype(like.dtype) if value.dtype != like.dtype else value, like.sharding)


# ------------------------------------------------------------------------------ randomness
RNG_ENTRIES = ("key_data", "impl", "count")


def rng_variables(model: Any) -> dict[str, nnx.Variable]:
    """The model's random state by name: ``nnx.Rngs`` streams' keys (``RngKey``) and counts (``RngCount``)."""
    from ._step import dotted

    return {dotted(path): variable for path, variable in nnx.to_flat_state(nnx.state(model, nnx.RngState))}


def rng_state(model: Any) -> dict[str, Any]:
    """Each stream's key data (uint32) and implementation, and each count, as numpy: every rank's goes to the
    checkpoint, and it is small."""
    state: dict[str, dict[str, Any]] = {entry: {} for entry in RNG_ENTRIES}
    for name, variable in rng_variables(model).items():
        value = variable.get_raw_value()
        if is_key(value):
            state["key_data"][name] = np.asarray(jax.random.key_data(value))
            state["impl"][name] = str(jax.random.key_impl(value))
        else:
            state["count"][name] = np.asarray(value)
    return state


def load_rng_state(model: Any, state: Mapping[str, Any]) -> None:
    check_rng_state_keys(state, RNG_ENTRIES, "jax", required=RNG_ENTRIES)
    variables = rng_variables(model)
    saved = {*state["key_data"], *state["count"]}
    if saved != set(variables):
        raise DriverError(f"load_rng_state: the model's random streams are {sorted(variables)}, the state's "
                          f"{sorted(saved)}; it was saved from a model with other nnx.Rngs.")
    for name, variable in variables.items():
        current = variable.get_raw_value()
        if name in state["key_data"]:
            key = jax.random.wrap_key_data(np.asarray(state["key_data"][name], np.uint32), impl=state["impl"][name])
            variable.set_raw_value(jax.device_put(key, current.sharding))
        else:
            variable.set_raw_value(placed(np.asarray(state["count"][name]), current, f"rng count {name!r}"))


def reseed(model: Any, seed: int) -> None:
    """Every stream of the model's ``nnx.Rngs`` keyed by ``seed`` and its name, its count back to 0."""
    for name, variable in rng_variables(model).items():
        value = variable.get_raw_value()
        if is_key(value):
            stream = zlib.crc32(name.rpartition(".")[0].encode())
            key = jax.random.fold_in(jax.random.key(seed, impl=str(jax.random.key_impl(value))), stream)
            variable.set_raw_value(jax.device_put(key, value.sharding))
        else:
            variable.set_raw_value(jnp.zeros_like(value))
