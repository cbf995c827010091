"""Call a function with the entries of a dict batch that its parameters name.

fastNLP users know this as "auto parameter matching": ``forward(self, x, y)``
receives ``batch["x"]`` and ``batch["y"]``; extra batch keys are ignored, a missing
one is an error naming the parameter and the keys that were there.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from typing import Any

from ._errors import BatchMismatchError, ConfigurationError

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
                "rename the batch keys, pass input_mapping={'batch_key': 'param'} or a function, "
                "or set model_wo_auto_param_call=True to receive the whole batch."
            ) from None
        raise


def as_dict(obj: Any) -> Any:
    """A dataclass instance becomes a shallow dict of its fields; anything else is returned as is."""
    if type(obj) is dict:  # the usual case; is_dataclass would raise and catch an AttributeError for it
        return obj
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    return obj


def loss_of(outputs: Any) -> Any:
    """``outputs["loss"]`` of a dict or dataclass output, or None."""
    if type(outputs) is dict:  # per batch under a progress bar: the usual case first
        return outputs.get("loss")
    data = as_dict(outputs)
    return data.get("loss") if isinstance(data, Mapping) else None


def make_mapping_fn(mapping: Any, argument: str) -> Callable[[Any], Any] | None:
    """Turn ``input_mapping``/``output_mapping`` (dict, callable or None) into one function."""
    if mapping is None:
        return None
    if callable(mapping):
        return mapping
    if isinstance(mapping, Mapping):
        renames = dict(mapping)

        def rename(data: Any) -> Any:
            data = as_dict(data)
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
