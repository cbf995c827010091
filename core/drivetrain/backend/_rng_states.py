"""The framework-free part of restoring saved random generator states."""

from __future__ import annotations

from typing import Any

from .._common import DriverError


def rng_state_list(value: Any, key: str, expected: str = "a list per device") -> list[Any]:
    """``state[key]`` of a saved RNG state as a list, refused (naming the key and ``expected``) when it is
    not a list or tuple."""
    if not isinstance(value, (list, tuple)):
        raise DriverError(f"load_rng_state: state[{key!r}] is a {type(value).__name__}; expected {expected}.")
    return list(value)
