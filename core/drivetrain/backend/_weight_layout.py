"""How each framework's model files differ from drivetrain's neutral layout: declared rules, no framework.

Why: the four frameworks build the same layers but store a few of their tensors differently
(paddle keeps a Linear weight as [in, out] and names BatchNorm statistics ``_mean``/``_variance``;
jittor's BatchNorm has no ``num_batches_tracked``). A backend declares those differences once, as
data in its :class:`~drivetrain.DriverSpec` (``weight_layout=``); moving weights between two
frameworks applies the source's rules backwards, into the neutral layout, then the target's forwards.

The neutral layout is torch's: names and shapes as ``torch.nn`` stores them (oneflow's are the same).
A backend whose files already look like that declares nothing (the default).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .._common import ConfigurationError

NEUTRAL_COMPANIONS: dict[str, tuple[str, str]] = {"num_batches_tracked": ("running_mean", "I64")}
"""Neutral tensors some frameworks do not hold, by last name component: ``(the tensor beside which the neutral
layout has it, its dtype)``. BatchNorm's step counter counts the batches its statistics saw; a target that has it
gets 0 (a scalar) when the source framework keeps no such counter."""


@dataclass(frozen=True)
class TensorRule:
    """One way a framework stores a tensor unlike the neutral layout.

    Args:
        name: the tensor's last name component as the framework stores it (``"_mean"``, ``"weight"``).
        neutral: its name in the neutral layout when that differs (``"running_mean"``).
        transpose: a 2-D tensor stored as the transpose of the neutral one (paddle's Linear weight, [in, out]
            for [out, in]).
        modules: the rule applies only to tensors of modules whose class, or one of its base classes, has one
            of these names (compared case-insensitively, so ``"Linear"`` matches torch's, paddle's, jittor's
            and oneflow's ``Linear``); empty: in every module.
        permute: a tensor of ``len(permute)`` dimensions stored with the neutral tensor's axes in this order
            (``numpy.transpose(neutral, permute)``): ``(2, 3, 1, 0)`` stores a convolution kernel
            ``[out, in, h, w]`` as ``[h, w, in, out]`` (flax's HWIO); empty: the axes as they are.

    Raises:
        ConfigurationError: a name with dots, no class names, a ``permute`` that is not an order of the axes
            (or comes with ``transpose``), or a rule that changes nothing.
    """

    name: str
    neutral: str | None = None
    transpose: bool = False
    modules: tuple[str, ...] = ()
    permute: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for field, value in (("name", self.name), ("neutral", self.neutral or "x")):
            if not isinstance(value, str) or not value or "." in value:
                raise ConfigurationError(f"TensorRule({field}={value!r}): give the last component of a tensor name, "
                                         "a non-empty str without dots (e.g. '_mean').")
        if not isinstance(self.modules, tuple) or not all(isinstance(m, str) and m for m in self.modules):
            raise ConfigurationError(f"TensorRule(modules={self.modules!r}) must be a tuple of class names, "
                                     "e.g. ('Linear',).")
        if not isinstance(self.permute, tuple) or sorted(self.permute) != list(range(len(self.permute))) \
                or (self.permute and self.transpose):
            raise ConfigurationError(f"TensorRule(permute={self.permute!r}) must be a tuple ordering the axes 0..n-1 "
                                     "(e.g. (2, 3, 1, 0)), without transpose=True (that is permute=(1, 0)).")
        if self.neutral is None and not self.transpose and not self.permute:
            raise ConfigurationError(f"TensorRule({self.name!r}) changes nothing; give neutral='<name>' and/or "
                                     "transpose=True or permute=(...).")

    @property
    def axes(self) -> tuple[int, ...]:
        """The order of the neutral tensor's axes in the stored one (``(1, 0)`` for ``transpose``; empty: as is)."""
        return (1, 0) if self.transpose else self.permute

    @property
    def neutral_name(self) -> str:
        """The tensor's last name component in the neutral layout."""
        return self.neutral or self.name

    def applies_to(self, classes: Iterable[str]) -> bool:
        """Whether a module of these class names falls under the rule.

        Args:
            classes: the module's class name and its base classes' names.

        Returns:
            True when the rule names no module class or one of ``classes``.
        """
        if not self.modules:
            return True
        wanted = {m.lower() for m in self.modules}
        return any(c.lower() in wanted for c in classes)


@dataclass(frozen=True)
class WeightLayout:
    """A framework's model files against the neutral layout; ``WeightLayout()`` is the neutral layout itself.

    Args:
        rules: the framework's :class:`TensorRule` list.
        lacks: neutral tensors its models never hold (last name components such as ``"num_batches_tracked"``),
            dropped when weights come in, filled when they go out.

    Raises:
        ConfigurationError: ``rules`` or ``lacks`` is not a tuple of the right items.
    """

    rules: tuple[TensorRule, ...] = ()
    lacks: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.rules, tuple) or not all(isinstance(r, TensorRule) for r in self.rules):
            raise ConfigurationError(f"WeightLayout(rules={self.rules!r}) must be a tuple of drivetrain.TensorRule.")
        if not isinstance(self.lacks, tuple) or not all(isinstance(n, str) and n for n in self.lacks):
            raise ConfigurationError(f"WeightLayout(lacks={self.lacks!r}) must be a tuple of tensor names "
                                     "(last components), e.g. ('num_batches_tracked',).")

    def stored_rule(self, name: str) -> list[TensorRule]:
        """The rules for a tensor stored under a last name component.

        Args:
            name: the last component as this framework stores it.

        Returns:
            The rules whose ``name`` it is (usually none or one).
        """
        return [rule for rule in self.rules if rule.name == name]

    def neutral_rule(self, neutral: str) -> list[TensorRule]:
        """The rules for a neutral tensor.

        Args:
            neutral: the tensor's last name component in the neutral layout.

        Returns:
            The rules that store it differently (usually none or one).
        """
        return [rule for rule in self.rules if rule.neutral_name == neutral]

    def to_json(self) -> dict[str, Any]:
        """The layout as plain data, recorded in every manifest so any reader can undo it.

        Returns:
            ``{"rules": [...], "lacks": [...]}``.
        """
        return {"rules": [{"name": r.name, "neutral": r.neutral, "transpose": r.transpose, "modules": list(r.modules),
                           **({"permute": list(r.permute)} if r.permute else {})}
                          for r in self.rules], "lacks": list(self.lacks)}

    @classmethod
    def from_json(cls, data: Any, where: str) -> WeightLayout:
        """Inverse of :meth:`to_json`.

        Args:
            data: what :meth:`to_json` returned, read back from a manifest or file.
            where: the file it came from, for the error message.

        Returns:
            The layout.

        Raises:
            ConfigurationError: a damaged record, naming ``where``.
        """
        try:
            rules = tuple(TensorRule(r["name"], r.get("neutral"), bool(r.get("transpose")), tuple(r.get("modules", ())),
                                     tuple(r.get("permute", ()))) for r in data["rules"])
            return cls(rules, tuple(data.get("lacks", ())))
        except (KeyError, TypeError, AttributeError, ConfigurationError) as exc:
            raise ConfigurationError(f"{where}: the recorded weight layout is damaged ({exc}).") from None


NEUTRAL = WeightLayout()
"""The neutral layout (torch's names and shapes): the default of every backend."""


def encode_classes(classes: Mapping[str, tuple[str, ...]]) -> str:
    """Module classes as the compact JSON recorded in manifests and exported files."""
    return json.dumps({path: list(names) for path, names in sorted(classes.items())}, separators=(",", ":"))


def decode_classes(data: Any) -> dict[str, tuple[str, ...]] | None:
    """Inverse of :func:`encode_classes` (also accepts the decoded dict); None when nothing usable is recorded."""
    if isinstance(data, str):
        try:
            data = json.loads(data)
        except ValueError:
            return None
    if not isinstance(data, dict):
        return None
    return {str(path): tuple(str(n) for n in names) for path, names in data.items() if isinstance(names, list)}
