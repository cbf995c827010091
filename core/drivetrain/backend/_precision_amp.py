"""The framework-free part of a backend's mixed precision: autocast factory, loss-scaler options and state.

torch, paddle and oneflow run ``fp16``/``bf16`` the same way: the forward under an
autocast context made fresh per use, and for ``fp16`` a loss scaler whose options come
from ``<name>_kwargs`` and whose state is saved in checkpoints. :class:`AmpPrecision`
holds that shape once; a backend decides which autocast and which scaler to build (and
when to warn and fall back to fp32), and words its own scaler in the load warnings.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from typing import Any, ClassVar

from .._common import DriverError
from ._module_driver import NULL_CONTEXT
from ._state_checks import scaler_state_to_load


def scaler_options(options: Mapping[str, Any] | None, precision: str, argument: str,
                   accepted: Iterable[str] | Mapping[str, str], *, check_keys: bool = True) -> dict[str, Any]:
    """The user's loss-scaler options as a new dict: any (even empty) refused under a precision other than
    fp16, unknown keys refused when ``check_keys`` (False: the run builds no scaler, e.g. fp16 on a CPU).

    ``argument`` names the option in messages (``"torch_kwargs['grad_scaler_kwargs']"``);
    ``accepted`` lists the keys, or maps each to a few words that the error then shows.
    """
    if options is not None and precision != "fp16":
        raise DriverError(
            f"{argument} only applies to precision='fp16', got precision={precision!r}; "
            "remove it or use precision='fp16'."
        )
    options = dict(options or {})
    unknown = sorted(set(options) - set(accepted))
    if unknown and check_keys:
        words = (", ".join(f"{key} ({text})" for key, text in accepted.items()) if isinstance(accepted, Mapping)
                 else list(accepted))
        raise DriverError(f"{argument} has unknown key(s) {unknown}; accepted: {words}.")
    return options


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


SCALER_VALUES: dict[str, Callable[[Any], bool]] = {
    "float > 0": lambda value: _finite(value) and value > 0,
    "float > 1": lambda value: _finite(value) and value > 1,
    "float in (0, 1)": lambda value: _finite(value) and 0 < value < 1,
    "int >= 1": lambda value: isinstance(value, int) and not isinstance(value, bool) and value >= 1,
    "bool": lambda value: isinstance(value, bool),
}
"""What a loss scaler's option may be (a scale, a growth or a backoff factor, a step count, a switch), by the
words that say it; a backend's description of each option starts with them (``"float > 1: ..."``)."""


def check_scaler_values(options: Mapping[str, Any], described: Mapping[str, str], argument: str) -> None:
    """Refuse a loss-scaler option whose value breaks the rule its description starts with.

    ``described`` maps each key to ``"<rule>: <what it does>"``, the rule one of
    :data:`SCALER_VALUES`; the error names ``argument[key]`` and shows the whole description.
    """
    for key, value in options.items():
        words = described[key]
        rule = SCALER_VALUES.get(words.partition(":")[0])
        if rule is None:  # the backend's own mistake, found by its first test
            raise ValueError(f"check_scaler_values: the description of {key!r} ({words!r}) must start with one of "
                             f"{list(SCALER_VALUES)} and a colon.")
        if not rule(value):
            raise DriverError(f"{argument}[{key!r}]={value!r} is not accepted; it must be {words}.")


def no_bf16_error(device: Any) -> DriverError:
    """The error for ``precision='bf16'`` on a GPU older than Ampere."""
    return DriverError(
        f"precision='bf16' on {device}: this GPU does not support bfloat16 (it needs compute capability 8.0, "
        "Ampere, or newer); use precision='fp16'."
    )


class AmpPrecision:
    """One precision on one device: the autocast to enter around the forward, and the optional loss scaler.

    A backend's subclass sets ``make_autocast`` (a factory: an autocast object saves the
    previous state on itself, so one instance cannot be nested) unless the precision runs
    as fp32, and ``scaler`` under fp16. The class attributes word the scaler in the
    warnings of :meth:`load_state`; :meth:`ignored_tail` and :meth:`load_scaler` may be
    overridden.
    """

    scaler_kind: ClassVar[str] = "grad scaler"
    """The scaler in words: ``"the checkpoint has no grad scaler state"``."""
    saved_with: ClassVar[str] = "precision='fp16'"
    """What a run with a scaler uses: ``"(it was not saved with precision='fp16')"``."""
    fresh_scaler: ClassVar[str] = "GradScaler"
    """What a run starts without a saved state: ``"this run starts a fresh GradScaler"``."""

    def __init__(self, precision: str) -> None:
        self.precision = precision
        self.scaler: Any = None
        self.make_autocast: Callable[[], AbstractContextManager[Any]] | None = None

    def autocast(self) -> AbstractContextManager[Any]:
        """A context that runs the forward in this precision (the shared no-op when it runs as fp32)."""
        return NULL_CONTEXT if self.make_autocast is None else self.make_autocast()

    def state(self) -> dict[str, Any] | None:
        """The loss scaler's state under fp16 (plain numbers), else None."""
        return None if self.scaler is None else dict(self.scaler.state_dict())

    def wants_state(self) -> bool:
        """Whether a checkpoint without a scaler state deserves a warning."""
        return self.scaler is not None

    def ignored_tail(self) -> str:
        """Words after ``precision=...`` when a saved scaler state is ignored."""
        return ", which needs no scaler"

    def load_state(self, state: Any) -> None:
        """Restore :meth:`state`, so the resumed run scales (and skips overflowing steps) exactly as before."""
        state = scaler_state_to_load(
            state, scaler=self.scaler is not None, expected=self.wants_state(),
            missing=f"the checkpoint has no {self.scaler_kind} state (it was not saved with {self.saved_with}); "
            f"this run starts a fresh {self.fresh_scaler}, so its first steps may differ from a continued run.",
            ignored=f"the checkpoint holds a {self.scaler_kind} state (saved with {self.saved_with}) but this run "
            f"uses precision={self.precision!r}{self.ignored_tail()}; the state is ignored.")
        if state is not None and self.scaler is not None:
            self.load_scaler(state)

    def load_scaler(self, state: Mapping[str, Any]) -> None:
        """Put a checked saved state into the scaler."""
        self.scaler.load_state_dict(dict(state))

    def describe(self) -> str:
        """The precision as it runs: a low precision without an autocast (paddle's and oneflow's on a CPU, which
        warn once) says that it trains in fp32."""
        if self.make_autocast is not None or self.precision == "fp32":
            return self.precision
        return f"{self.precision} (runs in fp32 on CPU)"
