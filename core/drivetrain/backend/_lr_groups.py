"""Learning rates for frameworks that keep one rate per optimizer, scaled per param group by a fixed multiplier.

``Driver.get_lrs``/``set_lrs`` speak of one rate per param group. paddle keeps one rate
per optimizer, and a param group's ``learning_rate`` entry is a fixed multiplier of it:
a group steps with ``rate * multiplier``. Reading the rates is a product; setting them
is possible only when the new rates keep the groups' ratios. That arithmetic and its
error messages are framework-free and live here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from .._common import DriverError


def group_multipliers(groups: Sequence[Mapping[str, Any]] | None, where: str, *, framework: str,
                      key: str = "learning_rate") -> list[float]:
    """Each param group's ``group[key]`` (1 when absent) as a float; ``[1.0]`` without param groups.

    A value that is not a number is refused, naming ``where`` and the group.
    """
    if not groups:
        return [1.0]
    multipliers = []
    for g, group in enumerate(groups):
        value = group.get(key, 1.0)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise DriverError(
                f"{where}: param group {g} has {key}={value!r:.60}, not a number; the {framework} driver reads "
                f"a param group's {key} as a multiplier of the optimizer's rate."
            )
        multipliers.append(float(value))
    return multipliers


def shared_rate(rates: Sequence[float], multipliers: Sequence[float], current: float, where: str, *,
                framework: str, key: str = "learning_rate") -> float:
    """The optimizer's one rate with which each group steps with ``rates`` (``current`` when every multiplier
    is 0); refused, naming the ratios, when ``rates`` do not keep the groups' ratios."""
    reference = next((j for j, m in enumerate(multipliers) if m != 0.0), None)
    rate = current if reference is None else rates[reference] / multipliers[reference]
    if not all(math.isclose(r, rate * m, rel_tol=1e-9, abs_tol=1e-30) for r, m in zip(rates, multipliers, strict=True)):
        raise DriverError(
            f"set_lrs: {where} gets rates {list(rates)}, but {framework} keeps one learning rate per optimizer and "
            f"each param group's {key} is a fixed multiplier of it ({list(multipliers)}); pass rates in those "
            "ratios, or give the groups separate optimizers."
        )
    return float(rate)
