"""Validation of Trainer/Evaluator arguments, shared so both say the same thing the same way."""

from __future__ import annotations

from typing import Any

from ._driver import PRECISIONS, Driver
from ._errors import ConfigurationError
from ._plugins import create_driver

BACKEND_KWARGS_SUFFIX = "_kwargs"


def check_int(value: Any, argument: str, *, minimum: int | None = None, allowed: tuple[int, ...] = ()) -> None:
    """An int (not bool) >= ``minimum`` or one of ``allowed``."""
    ok = isinstance(value, int) and not isinstance(value, bool)
    if ok and (value in allowed or minimum is None or value >= minimum):
        return
    accepted = f"an int >= {minimum}" if minimum is not None else "an int"
    if allowed:
        accepted += f" or one of {list(allowed)}"
    raise ConfigurationError(f"{argument}={value!r} is not accepted; it must be {accepted}.")


def check_optional_callable(value: Any, argument: str, signature: str) -> None:
    if value is not None and not callable(value):
        raise ConfigurationError(f"{argument}={value!r} must be a function {signature} or None.")


def resolve_precision(fp16: Any, precision: Any) -> str:
    """``fp16=True`` is shorthand for ``precision="fp16"``; the two must not disagree."""
    if not isinstance(fp16, bool):
        raise ConfigurationError(f"fp16={fp16!r} must be True or False (or use precision='fp16'/'bf16').")
    if precision is None:
        return "fp16" if fp16 else "fp32"
    if precision not in PRECISIONS:
        raise ConfigurationError(f"precision={precision!r} is not accepted; use one of {list(PRECISIONS)}.")
    if fp16 and precision != "fp16":
        raise ConfigurationError(f"fp16=True conflicts with precision={precision!r}; pass only one of them.")
    return precision


def split_backend_kwargs(kwargs: dict[str, Any]) -> tuple[dict[str, Any], set[str]]:
    """Pull ``torch_kwargs=...``-style options out of ``kwargs``; return them by driver name and the unknown rest."""
    backend: dict[str, Any] = {}
    unknown = set()
    for key, value in kwargs.items():
        if key.endswith(BACKEND_KWARGS_SUFFIX) and key != BACKEND_KWARGS_SUFFIX:
            if value is not None and not isinstance(value, dict):
                raise ConfigurationError(f"{key}={value!r} must be a dict of options for that driver.")
            backend[key[: -len(BACKEND_KWARGS_SUFFIX)]] = value or {}
        else:
            unknown.add(key)
    return backend, unknown


def build_driver(driver: Any, model: Any, device: Any, **options: Any) -> Driver:
    if not isinstance(driver, (str, Driver)):
        raise ConfigurationError(
            f"driver={driver!r} is not accepted; pass a driver name ('torch', 'paddle', ...), 'auto', or a Driver."
        )
    return create_driver(driver, model, device, **options)
