"""Validation of Trainer/Evaluator arguments, shared so both say the same thing the same way."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .errors import ConfigurationError, DriverError
from .suggest import close_matches, did_you_mean

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


PRECISIONS = ("fp32", "fp16", "bf16")
"""The precisions every driver accepts (``Driver.precision``)."""

PRECISION_ALIASES = {"16-mixed": "fp16", "bf16-mixed": "bf16", "32-true": "fp32"}
"""Lightning's names for the precisions drivetrain has (autocast in fp16 or bf16 over fp32 weights; plain fp32)."""


def resolve_precision(fp16: Any, precision: Any) -> str:
    """``fp16=True`` is shorthand for ``precision="fp16"``; the two must not disagree. Lightning's names are
    aliases (``"bf16-mixed"`` is ``"bf16"``)."""
    if not isinstance(fp16, bool):
        raise ConfigurationError(f"fp16={fp16!r} must be True or False (or use precision='fp16'/'bf16').")
    if precision is None:
        return "fp16" if fp16 else "fp32"
    if isinstance(precision, str):
        precision = PRECISION_ALIASES.get(precision, precision)
    if precision not in PRECISIONS:
        close = did_you_mean(precision, [*PRECISIONS, *PRECISION_ALIASES]) if isinstance(precision, str) else ""
        raise ConfigurationError(
            f"precision={precision!r} is not accepted; use one of {list(PRECISIONS)} (or Lightning's "
            f"{', '.join(map(repr, PRECISION_ALIASES))}).{close}")
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


def parameter_names(fn: Callable) -> list[str]:
    """The names ``fn`` accepts as keywords (no ``self``, ``*args`` or ``**kwargs``): what a typo is compared with."""
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [p.name for p in inspect.signature(fn).parameters.values() if p.kind in kinds and p.name != "self"]


def unknown_arguments_error(owner: str, unknown: Iterable[str], accepted: Iterable[str],
                            hint: str = "") -> ConfigurationError:
    """The error for keyword arguments ``owner`` does not take, with the closest accepted name for each.

    A misspelt option (``n_epoch=3``) would otherwise vanish into ``**kwargs``; naming the
    argument that was probably meant turns the error into its fix. ``hint`` (a sentence)
    says what else is accepted.
    """
    names = sorted(unknown)
    choices = sorted(set(accepted))
    notes = []
    for name in names:
        close = close_matches(name, choices)
        notes.append(f"{name}: did you mean {close[0]}=?" if close else f"{name}: no accepted argument is close")
    message = f"{owner} got unexpected argument(s) {names} ({'; '.join(notes)})."
    return ConfigurationError(f"{message} {hint}" if hint else message)


def check_keywords(cls: type) -> type:
    """Make ``cls(...)`` refuse a misspelt keyword argument with :func:`unknown_arguments_error` (the closest
    accepted name) instead of Python's bare TypeError; applied to every public callback and logger class.

    Wraps the ``__init__`` the class uses (its own or inherited) once, checking only the keyword names,
    so a subclass keeps working: its own ``__init__`` is left alone, and one inherited from a checked
    class checks against that class's parameters. An ``__init__`` taking ``**kwargs`` is left as it is.
    """
    init = cls.__init__  # type: ignore[misc]
    if getattr(init, "_checks_keywords", False):
        return cls
    parameters = inspect.signature(init).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return cls
    accepted = frozenset(parameter_names(init))

    @functools.wraps(init)
    def checked_init(self: Any, *args: Any, **kwargs: Any) -> None:
        if not accepted.issuperset(kwargs):
            # a subclass that inherits this __init__ is called by its own name; one with its own __init__ that
            # passes keywords on reaches this class's, whose parameters are the ones listed
            name = type(self).__name__ if type(self).__init__ is checked_init else cls.__name__
            raise unknown_arguments_error(name, set(kwargs) - accepted, accepted,
                                          f"{name} accepts {', '.join(parameter_names(init))}.")
        init(self, *args, **kwargs)

    checked_init._checks_keywords = True  # type: ignore[attr-defined]
    setattr(cls, "__init__", checked_init)  # noqa: B010 - mypy refuses assigning a method
    return cls


def bool_option(options: Mapping[str, Any], key: str, default: bool, *, argument: str) -> bool:
    """``options[key]`` (or ``default``), refusing anything but a real bool: ``"False"`` is truthy."""
    value = options.get(key, default)
    if not isinstance(value, bool):
        raise DriverError(f"{argument}[{key!r}]={value!r} must be True or False.")
    return value
