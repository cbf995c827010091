"""The checks of a saved model or gradient state that every backend words the same way.

``check_state_names`` checks a model state's names (``listed_names`` shows names in every such
message); the others check a gradient state's names and each saved tensor's shape. A backend passes
shapes the way its framework prints them (a tuple for torch, a list for paddle), so the
message shows the shape as a user of that framework knows it.

The loaders below run those checks over a whole state the way every backend does, with
the framework's own tensor calls passed in: ``as_tensor(value, where)`` (a framework
tensor from a tensor or numpy array, else a ``DriverError`` naming ``where``) and
``shape(tensor)`` (the shape as the framework prints it).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Container, Mapping
from typing import Any, TypeVar

from .._common import DriverError

T = TypeVar("T")


_MAX_LISTED = 10


def listed_names(names: list[str]) -> str:
    """``['a', 'b', ... 3 more]``: names for an error message, never a wall of them."""
    shown = ", ".join(repr(n) for n in names[:_MAX_LISTED])
    more = len(names) - _MAX_LISTED
    return f"[{shown}{f', ... {more} more' if more > 0 else ''}]"


def check_state_names(state: Any, expected: Any, owner: str, hint: str = "") -> None:
    """Refuse a model state that is not a mapping or whose names differ from ``expected`` (strict).

    ``owner`` names the model in the message (``type(model).__name__``); ``hint`` is a
    sentence added at the end (e.g. how a framework's wrappers prefix names).
    """
    if not isinstance(state, Mapping):
        raise DriverError(
            f"load_model_state(state={type(state).__name__}) needs a dict of name -> tensor, "
            "as returned by model_state() or load_tensors()."
        )
    missing = [name for name in expected if name not in state]
    unexpected = [name for name in state if name not in expected]
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing key(s) {listed_names(missing)}")
        if unexpected:
            parts.append(f"unexpected key(s) {listed_names(unexpected)}")
        raise DriverError(
            f"The state does not fit the model {owner}: {'; '.join(parts)}. "
            f"Was it saved from a different model class or architecture?{' ' + hint if hint else ''}"
        )




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
            f"load_gradient_state: the model {owner} has no parameter(s) {listed_names(unknown)}; "
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


def loadable_model_state(
    state: Any,
    expected: Mapping[str, Any],
    owner: str,
    *,
    as_tensor: Callable[[Any, str], T],
    shape: Callable[[Any], Any],
    cast: Callable[[T, Any], T] | None = None,
    hint: str = "",
) -> dict[str, T]:
    """``state`` checked against the model's ``expected`` tensors (names, then each shape), as tensors.

    ``cast(tensor, dtype)``, when given, converts a tensor whose ``dtype`` differs from the
    model's; without it the framework's ``load_state_dict`` casts. ``hint`` ends the name
    check's message (see ``check_state_names``).
    """
    check_state_names(state, expected, owner, hint)
    prepared: dict[str, T] = {}
    for name, target in expected.items():
        value = as_tensor(state[name], f"state[{name!r}]")
        check_state_shape(name, shape(value), shape(target))
        if cast is not None and value.dtype != target.dtype:  # type: ignore[attr-defined]
            value = cast(value, target.dtype)
        prepared[name] = value
    return prepared


def load_module_state(model: Any, state: Any, *, as_tensor: Callable[[Any, str], Any],
                      cast: Callable[[Any, Any], Any] | None = None, hint: str = "") -> None:
    """``model.load_state_dict`` of ``state`` checked by :func:`loadable_model_state` (names, shapes), strict.

    For a framework whose modules have torch's ``state_dict``/``load_state_dict(strict=)`` (torch, oneflow):
    the copy goes into the model's existing tensors, so optimizers built on them stay valid.
    """
    prepared = loadable_model_state(state, model.state_dict(), type(model).__name__, as_tensor=as_tensor,
                                    shape=lambda tensor: tuple(tensor.shape), cast=cast, hint=hint)
    model.load_state_dict(prepared, strict=True)


def module_gradients(model: Any, grads: Any, *, as_tensor: Callable[[Any, str], Any],
                     place: Callable[[Any, Any], Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A torch-style module's parameters by name and ``grads`` checked against them by
    :func:`loadable_gradients` (each shape taken as ``tuple(tensor.shape)``): ``(parameters, gradients)``."""
    params = dict(model.named_parameters())
    return params, loadable_gradients(grads, params, type(model).__name__, as_tensor=as_tensor,
                                      shape=lambda tensor: tuple(tensor.shape), place=place)


def loadable_gradients(
    grads: Any,
    parameters: Mapping[str, Any],
    owner: str,
    *,
    as_tensor: Callable[[Any, str], Any],
    shape: Callable[[Any], Any],
    place: Callable[[Any, Any], T],
) -> dict[str, T]:
    """The saved gradients checked against the model's ``parameters`` (names, then shapes).

    ``place(grad, parameter)`` returns the gradient as the parameter needs it (its device
    and dtype, a tensor of its own).
    """
    check_gradient_names(grads, parameters, owner)
    prepared: dict[str, T] = {}
    for name, value in grads.items():
        param = parameters[name]
        grad = as_tensor(value, f"load_gradient_state: grads[{name!r}]")
        check_gradient_shape(name, shape(grad), shape(param))
        prepared[name] = place(grad, param)
    return prepared


def optimizer_state_for_load(
    state: Any,
    where: str,
    framework: str,
    *,
    plain_entries: bool = False,
    copy: Callable[[Any], Any] | None = None,
) -> dict[str, Any]:
    """An optimizer ``state_dict`` (``{"state": ..., "param_groups": ...}``) with its per-parameter keys
    as ints again, each checked against the indices its param groups list.

    A JSON round trip turns the int keys into strings, and the framework's
    ``load_state_dict`` would keep those as unrelated entries: the optimizer would silently
    restart its moments. ``plain_entries`` lets other non-int keys (oneflow's ``"step"``)
    through; ``copy(value)``, when given, replaces each entry (a framework whose optimizers
    keep and update the very tensors they are given).
    """
    if not isinstance(state, Mapping) or "state" not in state or "param_groups" not in state:
        raise DriverError(
            f"{where} is a {type(state).__name__} without 'state' and 'param_groups'; it must be a "
            f"{framework} optimizer's state_dict(), as optimizer_states() returns."
        )
    indices = {index for group in state["param_groups"] for index in group.get("params", [])}
    per_param: dict[Any, Any] = {}
    for key, value in state["state"].items():
        index = int(key) if isinstance(key, str) and key.isdigit() else key
        if (isinstance(index, int) or not plain_entries) and index not in indices:
            raise DriverError(
                f"{where}['state'] has an entry for parameter {key!r}, which none of its param_groups lists; "
                "the optimizer state is damaged or was not produced by optimizer_states()."
            )
        per_param[index] = value if copy is None else copy(value)
    return {**state, "state": per_param}


def scaler_state_to_load(state: Any, *, scaler: bool, expected: bool, missing: str, ignored: str) -> Any:
    """The grad scaler state to load into this run's scaler, or None when there is nothing to load.

    ``scaler``: this run has a scaler; ``expected``: it would have wanted a saved state.
    A checkpoint without one (``state`` None) warns ``missing`` when ``expected``; a state
    for a run without a scaler warns ``ignored`` (when the state holds anything). Anything
    but None or a mapping is refused. The warnings name the caller of the driver's
    ``load_precision_state``.
    """
    if state is None:
        if expected:
            warnings.warn(missing, UserWarning, stacklevel=4)
        return None
    if not isinstance(state, Mapping):
        raise DriverError(
            f"load_precision_state(state={type(state).__name__}) needs the dict returned by precision_state()."
        )
    if not scaler:
        if state:
            warnings.warn(ignored, UserWarning, stacklevel=4)
        return None
    return state


def check_rng_state_keys(state: Any, saved: tuple[str, ...], framework: str,
                         required: tuple[str, ...] = ("cpu",)) -> None:
    """Refuse an RNG state that is not a mapping with the ``required`` entries, or that holds entries other
    than ``saved`` (the keys the ``framework`` driver's ``rng_state()`` writes)."""
    if not isinstance(state, Mapping) or not set(required) <= set(state):
        entries = f"a {required[0]!r} entry" if len(required) == 1 else _and(required)
        raise DriverError(
            f"load_rng_state(state={state!r:.80}) needs the dict returned by rng_state(), with {entries}."
        )
    unknown = sorted(set(state) - set(saved))
    if unknown:
        raise DriverError(f"load_rng_state: unknown entr(ies) {unknown}; the {framework} driver saves {_and(saved)}.")


def _and(keys: tuple[str, ...]) -> str:
    """``'a', 'b' and 'c'``."""
    names = ", ".join(repr(key) for key in keys[:-1])
    return f"{f'{names} and ' if names else ''}{keys[-1]!r}"


def warn_device_states(saved: int, available: int, kind: str) -> int:
    """How many of ``saved`` per-device RNG states to restore on ``available`` devices; warns when the counts
    differ (``kind``: "CUDA", "GPU"), naming the caller of the driver's ``load_rng_state``."""
    if available != saved:
        warnings.warn(
            f"the checkpoint holds {kind} random states for {saved} device(s) but this machine has "
            f"{available}; restoring the first {min(available, saved)}. Randomness on the other devices "
            "(e.g. dropout) will differ from the original run.",
            UserWarning,
            stacklevel=4,
        )
    return min(available, saved)
