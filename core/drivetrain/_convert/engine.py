"""Moving named tensors from one framework's layout to another's, through the neutral layout.

The tensors are raw safetensors entries (dtype tag, shape, bytes): a transpose moves elements
as unsigned integers of the dtype's width, so every dtype (bf16 and float8 included) is moved
bit-exactly and no framework is needed. Which module a tensor belongs to (for rules that apply
to ``Linear`` modules only) is asked of a ``classes`` function: module path -> class names, or
None where it is not known.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from .._common import ConfigurationError
from .._format import ITEM_SIZES, CheckpointError
from ..backend import NEUTRAL_COMPANIONS, TensorRule, WeightLayout

NameMap = Mapping[str, str] | Callable[[str], str] | None
Classes = Callable[[str], tuple[str, ...] | None]


@dataclass(frozen=True)
class Tensor:
    """One tensor on its way: raw bytes, and the name it had in the file (for messages)."""

    dtype: str
    shape: tuple[int, ...]
    data: Any
    stored_as: str


def split_name(name: str) -> tuple[str, str]:
    """``("encoder.fc", "weight")`` for ``"encoder.fc.weight"``; a top-level tensor has module path ``""``."""
    path, _, leaf = name.rpartition(".")
    return path, leaf


def rename(name: str, name_map: NameMap) -> str:
    """``name`` under ``name_map``: a callable's answer, or the dict entry for the whole name or for its longest
    module-path prefix (``{"encoder": "backbone"}`` turns ``encoder.fc.weight`` into ``backbone.fc.weight``)."""
    if name_map is None:
        return name
    if callable(name_map) and not isinstance(name_map, Mapping):
        new = name_map(name)
        if not isinstance(new, str) or not new:
            raise ConfigurationError(f"name_map({name!r}) returned {new!r}; it must return the tensor's new name (a "
                                     "non-empty str), or the name itself to keep it.")
        return new
    if name in name_map:
        return name_map[name]
    parts = name.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        prefix = ".".join(parts[:cut])
        if prefix in name_map:
            target = name_map[prefix]
            return ".".join(([target] if target else []) + parts[cut:])
    return name


def check_name_map(name_map: Any) -> None:
    """Refuse a ``name_map`` that is neither a dict of str to str nor a callable."""
    if name_map is None or (callable(name_map) and not isinstance(name_map, Mapping)):
        return
    if not isinstance(name_map, Mapping) or not all(isinstance(k, str) and isinstance(v, str)
                                                    for k, v in name_map.items()):
        raise ConfigurationError(f"name_map={name_map!r} is not accepted; pass a dict of source name (a module path "
                                 "or a whole tensor name) to target name, e.g. {'encoder': 'backbone'}, or a function "
                                 "of a tensor name returning its new name.")


def _rule(rules: list[TensorRule], classes: tuple[str, ...] | None, name: str, side: str) -> TensorRule | None:
    """The rule of ``rules`` that applies to tensor ``name`` of a module of ``classes`` (None: unknown)."""
    if classes is None and any(rule.modules for rule in rules):
        scoped = [rule for rule in rules if rule.modules]
        how = " and ".join(f"of {' or '.join(rule.modules)} modules {_change(rule)}" for rule in scoped)
        kinds = " or ".join(kind for rule in scoped for kind in rule.modules)
        module = split_name(name)[0]
        raise CheckpointError(
            f"{name!r}: the {side} framework stores the {scoped[0].neutral_name!r} {how}, and whether "
            f"{repr(module) if module else 'the model itself'} is such a module ({kinds}) is not known here (the "
            "file records no module classes). "
            "Load it into a model instead (trainer.load_model(folder) or drivetrain.load_weights(model, folder)), "
            "which reads the classes from the model.")
    return next((rule for rule in rules if rule.applies_to(classes or ())), None)


def _change(rule: TensorRule) -> str:
    """What ``rule`` does to a tensor, for a message (``"transposed"``, ``"as 'scale'"``)."""
    renamed = f"as {rule.name!r}" if rule.neutral is not None else ""
    moved = "transposed" if rule.transpose else f"with axes {list(rule.permute)}" if rule.permute else ""
    return " and ".join(part for part in (moved, renamed) if part)


def _permuted(tensor: Tensor, name: str, axes: tuple[int, ...]) -> Tensor:
    """``tensor`` with its axes in the order ``axes`` (``(1, 0)``: the transpose), its bytes moved exactly."""
    if len(tensor.shape) != len(axes):
        raise CheckpointError(f"{name!r} (stored as {tensor.stored_as!r}) has shape {list(tensor.shape)}; the layout "
                              f"rule that reorders its axes as {list(axes)} expects a {len(axes)}-D tensor.")
    width = np.dtype(f"u{ITEM_SIZES[tensor.dtype]}")
    moved = np.ascontiguousarray(np.frombuffer(tensor.data, dtype=width).reshape(tensor.shape).transpose(axes))
    return replace(tensor, shape=tuple(moved.shape), data=moved.reshape(-1).view(np.uint8).data)


def to_neutral(tensors: Mapping[str, Tensor], layout: WeightLayout, classes: Classes,
               name_map: NameMap) -> dict[str, Tensor]:
    """The source's tensors renamed by ``name_map`` and brought into the neutral layout by its ``layout``.

    ``classes`` is asked with module paths as the source stores them (before ``name_map``).
    """
    neutral: dict[str, Tensor] = {}
    for name, tensor in tensors.items():
        mapped = rename(name, name_map)
        path, leaf = split_name(mapped)
        rule = _rule(layout.stored_rule(leaf), classes(split_name(name)[0]), name, "source")
        if rule is not None:
            leaf = rule.neutral_name
            tensor = _permuted(tensor, name, tuple(int(a) for a in np.argsort(rule.axes))) if rule.axes else tensor
        new = f"{path}.{leaf}" if path else leaf
        if new in neutral:
            raise CheckpointError(f"{name!r} and {neutral[new].stored_as!r} both become {new!r}; give name_map= "
                                  "distinct targets.")
        neutral[new] = tensor
    return neutral


def from_neutral(neutral: Mapping[str, Tensor], layout: WeightLayout, classes: Classes) -> dict[str, Tensor]:
    """Neutral tensors in the target's ``layout`` (``classes`` asked with the target's module paths); the
    neutral tensors it lacks are left out."""
    out: dict[str, Tensor] = {}
    for name, tensor in neutral.items():
        path, leaf = split_name(name)
        if leaf in layout.lacks:
            continue
        rule = _rule(layout.neutral_rule(leaf), classes(path), name, "target")
        if rule is not None:
            leaf = rule.name
            tensor = _permuted(tensor, name, rule.axes) if rule.axes else tensor
        out[f"{path}.{leaf}" if path else leaf] = tensor
    return out


def companions(neutral: Mapping[str, Tensor], source: WeightLayout, target: WeightLayout) -> dict[str, Tensor]:
    """Neutral tensors the source framework keeps none of but the target holds (``NEUTRAL_COMPANIONS``), as zeros."""
    made: dict[str, Tensor] = {}
    for leaf, (beside, dtype) in NEUTRAL_COMPANIONS.items():
        if leaf not in source.lacks or leaf in target.lacks:
            continue
        for name in neutral:
            path, other = split_name(name)
            if other == beside:
                zero = np.zeros((), dtype=np.dtype(f"i{ITEM_SIZES[dtype]}"))
                made[f"{path}.{leaf}" if path else leaf] = Tensor(dtype, (), zero.reshape(-1).view(np.uint8).data,
                                                                  "(none: filled with 0)")
    return made
