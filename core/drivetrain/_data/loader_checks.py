"""The data itself where a dataloader belongs: Keras' ``fit(x, y)`` habit, refused when the Trainer is built.

An array, a tensor or a dict of them is iterable, so without this check the loop would take a
row (or a dict's key) for a batch and fail at the first ``forward`` with the framework's own
TypeError. The rule is the core's; the fix is shown in the driver's framework's words, from its
``tensor_dataloader_example`` attribute (code wrapping arrays ``x`` and ``y`` in a dataloader).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

import numpy as np

from .._common import DriverError


class TensorDriver(Protocol):
    """What the check reads of a :class:`~drivetrain.Driver` (named here so this module need not import it)."""

    name: str

    def is_tensor(self, obj: Any) -> bool: ...


GENERIC_EXAMPLE = "your framework's dataloader over a dataset of the arrays (torch's: DataLoader(TensorDataset(x, y)))"


def describe_data(value: Any, is_tensor: Callable[[Any], bool], framework: str) -> str | None:
    """How a message names ``value`` when it is data rather than a dataloader (``"a numpy array of shape (90, 4)"``,
    ``"a dict of arrays {'x': (90, 4), 'y': (90,)}"``); None for anything else."""
    single = _describe_array(value, is_tensor, framework)
    if single is not None or not isinstance(value, Mapping) or not value:
        return single
    if not all(_describe_array(v, is_tensor, framework) is not None for v in value.values()):
        return None
    shapes = ", ".join(f"{key!r}: {_shape(v)}" for key, v in value.items())
    return f"a dict of arrays {{{shapes}}}"


def _describe_array(value: Any, is_tensor: Callable[[Any], bool], framework: str) -> str | None:
    if isinstance(value, np.ndarray):
        return f"a numpy array of shape {_shape(value)}"
    if is_tensor(value):
        return f"a {framework} tensor of shape {_shape(value)}"
    return None


def _shape(value: Any) -> tuple[int, ...] | str:
    shape = getattr(value, "shape", None)
    try:
        return tuple(int(n) for n in shape)  # type: ignore[union-attr]
    except (TypeError, ValueError):
        return "?"


def check_not_data(value: Any, argument: str, driver: TensorDriver) -> None:
    """Raise a :class:`DriverError` naming ``argument`` and the fix when ``value`` is data, not a dataloader."""
    framework = getattr(getattr(driver, "framework", None), "__name__", None) or driver.name.split("_")[0]
    described = describe_data(value, driver.is_tensor, framework.split(".")[0])
    if described is None:
        return
    why = "iterating a dict gives its keys" if isinstance(value, Mapping) else "iterating it gives one sample at a time"
    example = getattr(driver, "tensor_dataloader_example", None) or GENERIC_EXAMPLE
    raise DriverError(
        f"{argument}={described} is the data itself, not a dataloader ({why}, not batches). Wrap the arrays "
        f"in a dataset and a dataloader that yields batches, e.g. {example}."
    )
