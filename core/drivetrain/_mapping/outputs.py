"""What a model returned, read the same way for every framework and every ecosystem.

Models return a dict (fastNLP), a ``ModelOutput`` (Hugging Face: an ordered dict that
is also a dataclass, ``None`` fields left out), a named tuple, a plain tuple
``(loss, logits, ...)`` (``return_dict=False``), a dataclass, or a bare tensor (zoo
models return logits). The loop needs two things from them: the loss to
backpropagate (training) and named values for metrics, callbacks and prediction
(:func:`named_outputs`). The rules live here once.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

from .._common import BatchMismatchError

PRED = "pred"
LOSS = "loss"

METRIC_ALIASES: dict[str, tuple[str, ...]] = {
    "pred": ("logits", "preds", "predictions", "prediction", "output"),
    "target": ("labels", "label", "targets", "y"),
}
"""Names looked up, in order, when a metric's ``update`` parameter is missing from batch + outputs."""


def _is_namedtuple(obj: Any) -> bool:
    return isinstance(obj, tuple) and hasattr(type(obj), "_fields")


def _dataclass_fields(obj: Any) -> dict[str, Any]:
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj) if getattr(obj, f.name) is not None}


def _is_single_value(value: Any) -> bool:
    """A value with exactly one element (a scalar loss), judged from its shape without importing a framework."""
    shape = getattr(value, "shape", None)
    if shape is None:  # a number, or a loss object of a framework without shapes (it converts to float)
        return not isinstance(value, (bool, str, bytes)) and hasattr(value, "__float__")
    try:
        return math.prod(int(d) for d in tuple(shape)) == 1
    except TypeError:
        return False


def describe(outputs: Any) -> str:
    """A short description of what was returned, for error messages."""
    if isinstance(outputs, Mapping):
        return f"{type(outputs).__name__} with keys {list(outputs)}"
    if _is_namedtuple(outputs):
        return f"named tuple {type(outputs).__name__}{tuple(type(outputs)._fields)}"
    if isinstance(outputs, (tuple, list)):
        return f"a {type(outputs).__name__} of {len(outputs)} value(s) ({', '.join(type(v).__name__ for v in outputs)})"
    if dataclasses.is_dataclass(outputs) and not isinstance(outputs, type):
        return f"dataclass {type(outputs).__name__} with fields {[f.name for f in dataclasses.fields(outputs)]}"
    shape = getattr(outputs, "shape", None)
    return f"{type(outputs).__name__}" + (f" of shape {list(shape)}" if shape is not None else "")


def find_loss(outputs: Any) -> Any:
    """The loss in ``outputs``, or None when there is none.

    By name (``"loss"``) in a dict, ``ModelOutput``, named tuple or dataclass; the first
    element of a plain tuple or list (Hugging Face's ``return_dict=False`` convention);
    the value itself when the function returned a bare tensor or number.
    """
    if type(outputs) is dict:  # the usual case first: this runs once per batch
        return outputs.get(LOSS)
    if isinstance(outputs, Mapping):
        return outputs.get(LOSS)
    if _is_namedtuple(outputs):
        return getattr(outputs, LOSS, None)
    if isinstance(outputs, (tuple, list)):
        return outputs[0] if outputs else None
    if dataclasses.is_dataclass(outputs) and not isinstance(outputs, type):
        return getattr(outputs, LOSS, None)
    if outputs is None or isinstance(outputs, (str, bytes, bool)):
        return None
    return outputs  # a bare tensor, number or loss object


def require_loss(outputs: Any, where: str) -> Any:
    """:func:`find_loss`, or a :class:`BatchMismatchError` naming what was returned and the fixes."""
    loss = find_loss(outputs)
    if loss is None:
        raise BatchMismatchError(
            f"the {where} returned {describe(outputs)}, with no loss in it. Return the loss (a dict with 'loss', "
            "a tuple whose first element is the loss, or the loss tensor itself), pass output_mapping="
            "{'your_key': 'loss'} (or a function) to the Trainer, or pass loss_fn=lambda outputs, batch: ... "
            "to compute it from the outputs."
        )
    return loss


def named_outputs(outputs: Any, where: str) -> dict[str, Any]:
    """``outputs`` as a flat-at-the-top dict of named values, for metrics, callbacks and prediction.

    dicts and ``ModelOutput`` as they are; named tuples and dataclasses by field (``None``
    fields left out); a bare tensor/array/number is ``{"pred": value}``; a plain tuple or
    list names its elements by position: ``"loss"`` for a first element holding a single
    value, then ``"pred"`` for the next, then ``"output_<i>"`` (``i`` = position).
    """
    if type(outputs) is dict:
        return outputs
    if isinstance(outputs, Mapping):
        return dict(outputs)
    if _is_namedtuple(outputs):
        return {k: v for k, v in outputs._asdict().items() if v is not None}
    if isinstance(outputs, (tuple, list)):
        return _name_positions(outputs)
    if dataclasses.is_dataclass(outputs) and not isinstance(outputs, type):
        return _dataclass_fields(outputs)
    if outputs is None or isinstance(outputs, (str, bytes)):
        raise BatchMismatchError(
            f"the {where} returned {describe(outputs)}; return the model's outputs (a tensor, a dict of "
            "tensors, a tuple or a ModelOutput)."
        )
    return {PRED: outputs}


def _name_positions(values: tuple | list) -> dict[str, Any]:
    named: dict[str, Any] = {}
    for i, value in enumerate(values):
        if i == 0 and len(values) > 1 and _is_single_value(value):
            named[LOSS] = value
        elif PRED not in named:
            named[PRED] = value
        else:
            named[f"output_{i}"] = value
    return named


def resolve_metric_inputs(data: Mapping[str, Any], names: list[str]) -> dict[str, str]:
    """For each parameter name, the key of ``data`` that feeds it: itself, or its first present alias."""
    found: dict[str, str] = {}
    for name in names:
        if name in data:
            found[name] = name
            continue
        for alias in METRIC_ALIASES.get(name, ()):
            if alias in data:
                found[name] = alias
                break
    return found


def flatten_outputs(named: Mapping[str, Any], is_leaf: Callable[[Any], bool]) -> dict[str, Any]:
    """Nested dicts/tuples/lists inside named outputs become ``"a.b"`` / ``"a.0"`` keys (for prediction)."""
    flat: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if value is None:
            return
        if is_leaf(value):
            flat[prefix] = value
        elif isinstance(value, Mapping):
            for k, v in value.items():
                walk(f"{prefix}.{k}", v)
        elif isinstance(value, (tuple, list)):
            for i, v in enumerate(value):
                walk(f"{prefix}.{i}", v)
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            for k, v in _dataclass_fields(value).items():
                walk(f"{prefix}.{k}", v)
        else:
            flat[prefix] = value

    for key, value in named.items():
        walk(str(key), value)
    return flat
