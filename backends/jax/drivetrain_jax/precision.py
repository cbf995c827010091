"""Precision: flax's own mixed precision, applied to a built model.

NNX has no autocast: a layer computes in its ``dtype`` (None: the promoted dtype of its inputs and parameters)
and keeps its parameters in ``param_dtype``. ``precision="bf16"`` sets ``dtype=bfloat16`` on every layer that
left it None, as if the model had been built with ``dtype=jnp.bfloat16, param_dtype=jnp.float32``: the forward
and backward compute in bfloat16 while parameters, gradients and optimizer state stay float32 (an update smaller
than bfloat16's resolution is not lost). Layers the user gave a dtype keep it (a final LayerNorm kept in float32).
fp16 is refused: without a loss scaler, small float16 gradients underflow to zero.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
from flax import nnx

from drivetrain.backend import DriverError

FP16_REFUSED = ("precision='fp16' is not supported by the jax driver: flax NNX has no loss scaling, so small "
                "float16 gradients would underflow to zero. Use precision='bf16' (same range as float32; on GPUs "
                "and TPUs as fast as float16), or build the model's layers with dtype=jnp.float16 yourself.")


def check_precision(precision: str) -> None:
    if precision == "fp16":
        raise DriverError(FP16_REFUSED)


def apply_precision(model: Any, precision: str) -> list[str]:
    """Set ``dtype=bfloat16`` on the layers that left it None (``precision="bf16"``); the paths of those layers."""
    if precision != "bf16":
        return []
    changed = []
    for path, module in nnx.iter_modules(model):
        if "dtype" in vars(module) and module.dtype is None:
            module.dtype = jnp.bfloat16
            changed.append(".".join(map(str, path)))
    return changed
