"""The checks of a saved model or gradient state that every backend words the same way.

``check_state_names`` (in :mod:`drivetrain.backend`) checks a model state's names;
these check a gradient state's names and each saved tensor's shape. A backend passes
shapes the way its framework prints them (a tuple for torch, a list for paddle), so the
message shows the shape as a user of that framework knows it.
"""

from __future__ import annotations

from collections.abc import Container, Mapping
from typing import Any

from ._errors import DriverError


def _listed(names: list[str]) -> str:
    from .backend import listed_names  # the one formatter of names in messages

    return listed_names(names)


def check_gradient_names(grads: Any, parameters: Container[str], owner: str) -> None:
    """Refuse a gradient state that is not a mapping, or that names a parameter not in ``parameters``.

    ``owner`` names the model in the message (``type(model).__name__``). Parameters the
    state leaves out are fine: they had no gradient when it was saved.
    """
    if not isinstance(grads, Mapping):
        raise DriverError(
            f"load_gradient_state(grads={type(grads).__name__}) needs a dict of parameter name -> tensor, "
            "as returned by gradient_state()."
        )
    unknown = [name for name in grads if name not in parameters]
    if unknown:
        raise DriverError(
            f"load_gradient_state: the model {owner} has no parameter(s) {_listed(unknown)}; "
            "the gradients were saved from a different model."
        )


def check_state_shape(name: str, shape: Any, expected: Any) -> None:
    """Refuse ``state[name]`` of ``shape`` for the model's tensor of shape ``expected``."""
    if shape != expected:
        raise DriverError(
            f"state[{name!r}] has shape {shape} but the model's {name!r} has shape "
            f"{expected}; the state was saved from a differently sized model."
        )


def check_gradient_shape(name: str, shape: Any, expected: Any) -> None:
    """Refuse the saved gradient ``grads[name]`` of ``shape`` for a parameter of shape ``expected``."""
    if shape != expected:
        raise DriverError(
            f"load_gradient_state: grads[{name!r}] has shape {shape} but the parameter has shape "
            f"{expected}; the gradients were saved from a differently sized model."
        )
