"""Argument checks every driver needs, with the messages every backend gives (re-exported by drivetrain.backend)."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from typing import Any

from .._common import DriverError
from ._plugins import available_drivers


def check_framework_kwargs(
    value: Any,
    accepted: Mapping[str, str],
    *,
    argument: str,
    not_here: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Validate a driver's ``<framework>_kwargs`` and return it as a new dict.

    ``accepted`` maps each option to a few words on what it does (they go into the
    error). ``not_here`` maps options that exist elsewhere (say, only for distributed
    training) to the sentence explaining why they do not apply to this driver.
    """
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise DriverError(f"{argument}={value!r} must be a dict or None; accepted keys: {sorted(accepted)}.")
    for key in value:
        if key in accepted:
            continue
        if not_here and key in not_here:
            raise DriverError(f"{argument}[{key!r}] {not_here[key]}")
        described = "; ".join(f"{name}: {what}" for name, what in accepted.items()) or "none"
        raise DriverError(f"{argument}[{key!r}] is not an option of this driver; accepted: {described}.")
    return dict(value)


def check_model_type(model: Any, module_type: type, *, driver: str, expected: str, forward: str = "forward") -> None:
    """Refuse a ``model`` that is not a ``module_type`` (``expected`` names it, e.g. ``"torch.nn.Module"``;
    ``forward`` is its forward method's name), naming the installed driver that claims such a model."""
    if isinstance(model, module_type):
        return
    if isinstance(model, type):
        raise DriverError(
            f"model={model!r:.80} is a class; pass an instance, e.g. {model.__name__}(); the {driver} driver "
            f"needs a {expected}."
        )
    kind = f"a {type(model).__module__}.{type(model).__qualname__}"
    fits = [spec.name for spec in available_drivers().values() if spec.name != driver and spec.claims(model)]
    if fits:
        raise DriverError(
            f"model={type(model).__qualname__}(...) is {kind}, not a {expected}: driver={driver!r} drives "
            f"{expected.split('.')[0]} models. Use driver={fits[0]!r} for this model (or driver='auto', which "
            "picks it)."
        )
    framework = (type(model).__module__ or "").split(".")[0]
    raise DriverError(
        f"model={model!r:.80} is {kind}, not a {expected}, and no installed driver claims {framework!r} models; "
        f"the {driver} driver needs a {expected} (class MyNet({expected}) with {forward}())."
    )


def check_lrs(lrs: Any, groups: list[int]) -> list[list[float]]:
    """``Driver.set_lrs``' argument as floats, refused unless it fits ``groups`` (param groups per optimizer).

    ``lrs`` must hold one list per optimizer, each with one finite number >= 0 per param
    group, the shape ``Driver.get_lrs`` returns.
    """
    shape = f"one list per optimizer ({len(groups)} here), each with one rate per param group ({groups} here)"
    if not isinstance(lrs, (list, tuple)) or len(lrs) != len(groups):
        raise DriverError(f"set_lrs(lrs={lrs!r:.80}) needs {shape}, as get_lrs() returns.")
    out: list[list[float]] = []
    for i, (rates, count) in enumerate(zip(lrs, groups, strict=True)):
        if not isinstance(rates, (list, tuple)) or len(rates) != count:
            raise DriverError(f"set_lrs: lrs[{i}]={rates!r:.80} does not fit; lrs needs {shape}.")
        row = []
        for j, rate in enumerate(rates):
            if isinstance(rate, bool) or not isinstance(rate, numbers.Real) or not math.isfinite(rate) or rate < 0:
                raise DriverError(f"set_lrs: lrs[{i}][{j}]={rate!r} is not a learning rate; pass a finite number >= 0.")
            row.append(float(rate))
        out.append(row)
    return out


def checked_cuda_index(given: Any, index: int | None, count: int, current: Callable[[], int], *,
                       spelling: str = "cuda", noun: str = "CUDA device(s)") -> int:
    """The CUDA device index ``device=given`` names (``current()`` when it names none), refused when it
    is not one of the ``count`` devices this process sees; the error spells devices as the framework
    does (``spelling``: ``cuda:1`` for torch, ``gpu:1`` for paddle, whose ``noun`` is ``GPU(s)``)."""
    if index is None:
        index = current()
    if index >= count:
        raise DriverError(
            f"device={given!r}: {spelling}:{index} does not exist, this process sees {count} {noun} "
            f"(valid: {', '.join(f'{spelling}:{i}' for i in range(count))}). Check CUDA_VISIBLE_DEVICES."
        )
    return index
