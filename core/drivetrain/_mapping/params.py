"""Call a function with the entries of a dict batch that its parameters name.

fastNLP users know this as "auto parameter matching": ``forward(self, x, y)``
receives ``batch["x"]`` and ``batch["y"]``; extra batch keys are ignored, a missing
one is an error naming the parameter and the keys that were there.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

import numpy as np

from .._common import BatchMismatchError, ConfigurationError, close_matches
from .outputs import find_loss

_SIGNATURES: dict[Any, tuple[list[str], list[str], bool]] = {}


def _signature_of(fn: Callable) -> tuple[list[str], list[str], bool]:
    """(required names, all names, takes **kwargs), cached per function object."""
    key = getattr(fn, "__func__", fn)
    cached = _SIGNATURES.get(key)
    if cached is not None:
        return cached
    required: list[str] = []
    names: list[str] = []
    var_kw = False
    for p in inspect.signature(fn).parameters.values():
        if p.kind is p.VAR_KEYWORD:
            var_kw = True
        elif p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            names.append(p.name)
            if p.default is p.empty:
                required.append(p.name)
    result = (required, names, var_kw)
    _SIGNATURES[key] = result
    return result


def auto_param_call(fn: Callable, batch: Mapping[str, Any], signature_fn: Callable | None = None) -> Any:
    """Call ``fn`` with the items of ``batch`` that ``signature_fn`` (default ``fn``) names."""
    sig_fn = signature_fn or fn
    cached = _SIGNATURES.get(getattr(sig_fn, "__func__", sig_fn))  # the cache hit inline: a per-batch path
    required, names, var_kw = cached if cached is not None else _signature_of(sig_fn)
    if var_kw:
        return fn(**batch)
    try:
        kwargs = {}
        for name in names:  # a loop, not a comprehension: one call less per batch before Python 3.12
            if name in batch:
                kwargs[name] = batch[name]
        return fn(**kwargs)
    except TypeError:
        missing = [name for name in required if name not in batch]
        if missing:
            fn_name = getattr(signature_fn or fn, "__qualname__", repr(fn))
            raise BatchMismatchError(
                f"{fn_name}() needs parameter(s) {missing} but the batch has keys {sorted(batch)}; "
                f"{_renaming_hint(missing, [k for k in batch if k not in names])}, or set "
                "model_wo_auto_param_call=True to receive the whole batch."
            ) from None
        raise


def _renaming_hint(missing: list[str], spare: list[Any]) -> str:
    """A concrete ``input_mapping`` pairing each missing parameter with an unused batch key (closest name first)."""
    pairs: dict[Any, str] = {}
    left = [k for k in spare if isinstance(k, str)]
    for name in missing:
        close = close_matches(name, left)
        key = close[0] if close else (left[0] if left else None)
        if key is None:
            break
        pairs[key] = name
        left.remove(key)
    if len(pairs) == len(missing):
        return f"pass input_mapping={pairs!r} (or a function returning the batch the model takes)"
    return "pass input_mapping= a function returning a dict with those keys"


class PositionalParameters(NamedTuple):
    """What :func:`positional_parameters` reads from a signature."""

    names: list[str]
    """The positional parameter names, in order."""
    required: int
    """How many of them have no default."""
    var_args: bool
    """Whether the function takes ``*args``."""
    var_kw: bool
    """Whether the function takes ``**kwargs``."""


def positional_parameters(fn: Callable) -> PositionalParameters:
    """(positional parameter names, how many are required, takes ``*args``, takes ``**kwargs``) of ``fn``."""
    names: list[str] = []
    required = 0
    var_pos = var_kw = False
    for p in inspect.signature(fn).parameters.values():
        if p.kind is p.VAR_POSITIONAL:
            var_pos = True
        elif p.kind is p.VAR_KEYWORD:
            var_kw = True
        elif p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            names.append(p.name)
            required += p.default is p.empty
    return PositionalParameters(names, required, var_pos, var_kw)


def make_batch_namer(signature_fn: Callable, wo_auto_param_call: bool) -> Callable[[Any], Any] | None:
    """A function naming a tuple/list batch by the step function's positional parameters, or None.

    ``DataLoader(TensorDataset(x, y))`` yields ``[x, y]``; with ``forward(self, x, target)``
    the batch becomes ``{"x": x, "target": y}``, so the model is called as usual and metrics
    and callbacks see named values. A function of one parameter keeps receiving the whole
    batch; a batch whose length fits no parameter list is refused with the fixes.
    """
    if wo_auto_param_call:
        return None
    try:
        names, required, var_pos, _ = positional_parameters(signature_fn)
    except (TypeError, ValueError):  # a builtin without a signature: nothing to match against
        return None
    if var_pos or len(names) <= 1:
        return None
    fn_name = getattr(signature_fn, "__qualname__", repr(signature_fn))

    def name_batch(batch: Any) -> Any:
        if type(batch) is not tuple and type(batch) is not list:
            return batch
        if required <= len(batch) <= len(names):
            return dict(zip(names, batch, strict=False))  # trailing defaults stay unset
        raise BatchMismatchError(
            f"the batch is a {type(batch).__name__} of {len(batch)} values but {fn_name}({', '.join(names)}) takes "
            f"{required if required == len(names) else f'{required} to {len(names)}'} positional parameter(s), so "
            f"they cannot be matched by position: {_by_position(names, len(batch))}. Say which value each parameter "
            f"gets, e.g. input_mapping=lambda batch: {_suggested_mapping(names, len(batch))} (the last value is "
            "usually the label; None where the batch has no value), or model_wo_auto_param_call=True to receive the "
            "whole batch as one argument."
        )

    return name_batch


def _by_position(names: list[str], count: int) -> str:
    """What matching ``count`` values to ``names`` by position would do, naming every parameter and every value
    (``"x would get batch[0], mask batch[1], and target no value"``)."""
    parts = [f"{name} {'would get ' if i == 0 else ''}batch[{i}]" for i, name in enumerate(names[:count])]
    parts += [f"{name} no value" for name in names[count:]]
    parts += [f"batch[{i}] goes to no parameter" for i in range(len(names), count)]
    return ", ".join(parts[:-1]) + f", and {parts[-1]}"


def _suggested_mapping(names: list[str], count: int) -> str:
    """An ``input_mapping`` body giving every parameter a value: the values in order, the last one (the label, by
    habit) to the last parameter, None to the parameters left over (``{'x': batch[0], 'mask': None, 'target':
    batch[1]}``)."""
    if count < 2:  # one value: the input
        return "{" + ", ".join(f"{name!r}: {'batch[0]' if i == 0 else 'None'}" for i, name in enumerate(names)) + "}"
    values = {name: f"batch[{i}]" for i, name in enumerate(names[:count - 1])}
    values.update({name: "None" for name in names[count - 1:-1]})
    values[names[-1]] = f"batch[{count - 1}]"
    return "{" + ", ".join(f"{name!r}: {value}" for name, value in values.items()) + "}"


def _raw_values(batch: Any, is_tensor: Callable[[Any], bool], path: str = "batch", depth: int = 0) -> list[str]:
    """Where ``batch`` holds numpy arrays or lists of numbers that are not the framework's tensors
    (``["batch['x'] (numpy.ndarray)"]``); a few levels deep, for an error message only."""
    if is_tensor(batch) or depth > 3:
        return []
    if isinstance(batch, np.ndarray):
        return [f"{path} (numpy.ndarray)"]
    items: Iterable[tuple[str, Any]] = ()
    if isinstance(batch, Mapping):
        items = ((f"{path}[{k!r}]", v) for k, v in batch.items())
    elif isinstance(batch, (list, tuple)):
        if batch and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in batch):
            return [f"{path} (a python {type(batch).__name__} of numbers)"]
        items = ((f"{path}[{i}]", v) for i, v in enumerate(batch))
    found: list[str] = []
    for where, value in items:
        found += _raw_values(value, is_tensor, where, depth + 1)
    return found


def explain_call_failure(batch: Any, fn: Callable, signature_fn: Callable | None, exc: Exception, *,
                         driver_name: str, is_tensor: Callable[[Any], bool] | None,
                         to_tensor_example: str | None) -> BatchMismatchError | None:
    """Why calling the step function on ``batch`` raised ``exc``, when the batch is the likely cause; else None.

    Two first-hour mistakes end in the framework's own TypeError deep in the model: numpy arrays
    or python lists in the batch (the driver moves tensors, it converts nothing), and a
    ``forward(self, x)`` handed a whole ``(x, y)`` tuple. Only called once the call failed, so
    the per-batch path pays nothing.
    """
    sig_fn = signature_fn or fn
    fn_name = getattr(sig_fn, "__qualname__", repr(sig_fn))
    faults = [fault for fault in (_raw_fault(batch, is_tensor, driver_name, to_tensor_example),
                                  _whole_tuple_fault(batch, sig_fn, fn_name)) if fault]
    if not faults:
        return None
    also = "".join(f" Also, {fault[0].lower()}{fault[1:]}" for fault in faults[1:])
    return BatchMismatchError(f"{fn_name}() raised {type(exc).__name__}: {exc}. {faults[0]}{also}")


def _raw_fault(batch: Any, is_tensor: Callable[[Any], bool] | None, driver_name: str,
               to_tensor_example: str | None) -> str:
    raw = _raw_values(batch, is_tensor) if is_tensor is not None else []
    if not raw:
        return ""
    shown = ", ".join(raw[:3]) + (f" and {len(raw) - 3} more" if len(raw) > 3 else "")
    example = f" (e.g. {to_tensor_example})" if to_tensor_example else ""
    return (f"The batch holds values that are not {driver_name} tensors: {shown}; the {driver_name} driver moves "
            "tensors to the device but converts nothing else. Convert them to tensors in the Dataset's "
            f"__getitem__ or in the DataLoader's collate_fn{example}, or pass input_mapping= a function that "
            "converts the batch.")


def _whole_tuple_fault(batch: Any, sig_fn: Callable, fn_name: str) -> str:
    if (type(batch) is not tuple and type(batch) is not list) or len(batch) < 2:
        return ""
    try:
        names, _, var_pos, _ = positional_parameters(sig_fn)
    except (TypeError, ValueError):
        return ""
    if var_pos or len(names) != 1:
        return ""
    name, kind = names[0], type(batch).__name__
    keys = [name] + ["target" if i == 1 else f"extra_{i}" for i in range(1, len(batch))]
    mapping = "{" + ", ".join(f"{key!r}: batch[{i}]" for i, key in enumerate(keys)) + "}"
    return (f"The batch is a {kind} of {len(batch)} values (e.g. (x, y) from a TensorDataset) but "
            f"{fn_name}({name}) takes one parameter, so it received the whole {kind} as {name!r}. Name the "
            f"values: pass input_mapping=lambda batch: {mapping} to the Trainer; the model then gets "
            f"{name}=batch[0], and loss_fn, metrics and callbacks see the batch as that dict (batch['target']). "
            f"Or add parameters for the other values to {fn_name}.")


def as_dict(obj: Any) -> Any:
    """A dataclass instance becomes a shallow dict of its fields; anything else is returned as is."""
    if type(obj) is dict:  # the usual case; is_dataclass would raise and catch an AttributeError for it
        return obj
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    return obj


def loss_of(outputs: Any) -> Any:
    """The loss in a model's outputs (by name, first tuple element or the bare value), or None."""
    if type(outputs) is dict:  # per batch under a progress bar: the usual case first
        return outputs.get("loss")
    return find_loss(outputs)


def make_mapping_fn(mapping: Any, argument: str,
                    to_dict: Callable[[Any], Any] = as_dict) -> Callable[[Any], Any] | None:
    """Turn ``input_mapping``/``output_mapping`` (dict, callable or None) into one function.

    A dict renames keys of the data after ``to_dict`` has made a dict of it (model outputs
    of any shape are named first, see :func:`drivetrain._mapping.outputs.named_outputs`).
    """
    if mapping is None:
        return None
    if callable(mapping):
        return mapping
    if isinstance(mapping, Mapping):
        renames = dict(mapping)

        def rename(data: Any) -> Any:
            data = to_dict(data)
            if not isinstance(data, Mapping):
                raise BatchMismatchError(
                    f"{argument} is a dict, so it needs dict or dataclass data, got {type(data).__name__}; "
                    f"pass a function as {argument} instead."
                )
            return {renames.get(k, k): v for k, v in data.items()}

        return rename
    raise ConfigurationError(
        f"{argument}={mapping!r} is not accepted; pass a dict {{old_key: new_key}}, a function, or None."
    )
