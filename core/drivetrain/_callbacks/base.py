"""Callback classes and the one dispatcher behind every way of attaching a handler."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from .._common import ConfigurationError, DrivetrainError, EarlyStopException
from .events import (
    EVENT_ARGS,
    Event,
    FilteredHandler,
    check_handler_signature,
    event_arguments,
    unknown_event_message,
)

RANK_ZERO_ATTR = "__drivetrain_rank_zero_only__"


def rank_zero_only(fn: Callable) -> Callable:
    """Mark a function callback to run only on the global-zero process in distributed training.

    The counterpart of ``Callback.rank_zero_only = True`` for ``Trainer.on`` / ``add_callback_fn``.

    Args:
        fn: a handler function.

    Returns:
        ``fn`` itself, marked.
    """
    setattr(fn, RANK_ZERO_ATTR, True)
    return fn


class CallbackError(DrivetrainError, RuntimeError):
    """A callback raised; the message names the callback and the event, the cause is chained."""


class Callback:
    """Base class: override any ``on_<event>(self, trainer, ...)`` method of :class:`Event`.

    Only overridden methods are registered, so an empty callback costs nothing on the
    hot path. ``callback_name`` keys the callback's state in checkpoints; make it
    unique when the same class is used twice. ``rank_zero_only = True`` runs the
    callback on the global-zero process only in distributed training. ``changes_loss = False`` says
    that its ``on_before_backward`` only reads the outputs: a driver that computes the loss and its
    gradients in one call (``Capabilities.separate_backward=False``, e.g. JAX) then fires it after that
    call instead of refusing the callback.
    """

    rank_zero_only: bool = False
    changes_loss: bool = True
    """Whether ``on_before_backward`` may change the loss; False for a callback that only reads it."""

    @property
    def callback_name(self) -> str:
        """The name this callback's state is saved under in checkpoints (the class name unless overridden);
        two callbacks of one Trainer must not share it."""
        return type(self).__name__

    def on_save_checkpoint(self, trainer: Any) -> Any:
        """Return this callback's state to store in a checkpoint.

        Args:
            trainer: the `Trainer` saving the checkpoint.

        Returns:
            A JSON-serialisable value (None: nothing to save), given back to :meth:`on_load_checkpoint`.
        """
        return None

    def on_load_checkpoint(self, trainer: Any, states: Any) -> None:
        """Restore what :meth:`on_save_checkpoint` returned.

        Args:
            trainer: the `Trainer` loading the checkpoint.
            states: this callback's saved state, the value its ``on_save_checkpoint`` returned.
        """


def _define_default_methods() -> None:
    def make(name: str) -> Callable:
        def method(self: Callback, trainer: Any, *args: Any) -> None:  # the arguments are documented on Event
            return None

        method.__name__ = method.__qualname__ = name
        method.__doc__ = (f"Called as ``{name}({', '.join(('trainer',) + EVENT_ARGS[name])})``; [the events, in "
                          "firing order](../user-guide/callbacks.md#the-events-in-firing-order) say when.\n\n"
                          + event_arguments(name))
        # what help() and the docs show: the arguments the event passes, not the catch-all *args
        parameters = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
        parameters += [inspect.Parameter(arg, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation="Any")
                       for arg in ("trainer",) + EVENT_ARGS[name]]
        method.__signature__ = inspect.Signature(parameters, return_annotation="None")  # type: ignore[attr-defined]
        return method

    for name in EVENT_ARGS:
        if name not in Callback.__dict__:
            setattr(Callback, name, make(name))


_define_default_methods()

_STATEFUL = ("on_save_checkpoint", "on_load_checkpoint")


class CallbackManager:
    """Holds, per event, the ordered list of handlers and fires them.

    ``handlers[name]`` is a plain list the Trainer iterates directly on the hot path.
    """

    def __init__(self, *, is_global_zero: bool = True) -> None:
        self.handlers: dict[str, list[Callable]] = {name: [] for name in EVENT_ARGS}
        self.callbacks: list[Callback] = []
        self.is_global_zero = is_global_zero

    def add_callback(self, callback: Callback) -> None:
        if not isinstance(callback, Callback):
            raise ConfigurationError(
                f"callbacks contains {callback!r} of type {type(callback).__name__}; each item must be a "
                "drivetrain.Callback instance (or use Trainer.add_callback_fn(Event.on_..., fn) for a function)."
            )
        check_method_names(type(callback))
        names = {c.callback_name for c in self.callbacks}
        if callback.callback_name in names:
            raise ConfigurationError(
                f"two callbacks share callback_name={callback.callback_name!r}; override callback_name so "
                "their checkpoint states do not collide."
            )
        self.callbacks.append(callback)
        if callback.rank_zero_only and not self.is_global_zero:
            return
        for name in EVENT_ARGS:
            if name in _STATEFUL:
                continue
            if getattr(type(callback), name) is not getattr(Callback, name):
                method = getattr(callback, name)
                check_handler_signature(method, name, f"callbacks: {type(callback).__name__}.{name}")
                self.handlers[name].append(method)

    def add_fn(self, event: Event | str, fn: Callable, where: str = "add_callback_fn") -> None:
        if isinstance(event, str):
            event = Event(event)
        if not isinstance(event, Event):
            raise ConfigurationError(f"{where}: event={event!r} must be an Event such as Event.on_train_begin().")
        if not callable(fn):
            raise ConfigurationError(f"{where}: fn={fn!r} is not callable.")
        check_handler_signature(fn, event.name, where)
        if getattr(fn, RANK_ZERO_ATTR, False) and not self.is_global_zero:
            return
        self.handlers[event.name].append(FilteredHandler(fn, event) if event.is_filtered else fn)

    def fire(self, name: str, trainer: Any, *args: Any) -> None:
        """Call every handler of ``name``. A handler asking to stop (EarlyStopException) does not keep the event
        from the handlers after it (the evaluation that stops a run reaches every logger and the history); the
        stop is raised once they all ran."""
        stop: EarlyStopException | None = None
        for handler in self.handlers[name]:
            try:
                handler(trainer, *args)
            except EarlyStopException as exc:
                stop = stop or exc
            except (CallbackError, ConfigurationError):
                raise  # already explain themselves: a configuration error names the argument to fix
            except Exception as exc:
                raise _callback_error(handler, name, exc) from exc
        if stop is not None:
            raise stop

    def states(self, trainer: Any) -> dict[str, Any]:
        return {c.callback_name: c.on_save_checkpoint(trainer) for c in self.callbacks}

    def load_states(self, trainer: Any, states: dict[str, Any]) -> None:
        for c in self.callbacks:
            if c.callback_name in states:
                c.on_load_checkpoint(trainer, states[c.callback_name])


def check_method_names(cls: type) -> None:
    """Refuse ``on_xxx`` methods that match no event: the Trainer would never call them, silently."""
    for name in sorted(dir(cls)):
        if name.startswith("on_") and name not in EVENT_ARGS and callable(getattr(cls, name, None)):
            raise ConfigurationError(
                f"callbacks: {cls.__name__}.{name} would never be called: {unknown_event_message(name)} "
                "Rename it to the event it is meant for, or give a helper method a name that does not start "
                "with 'on_'."
            )


def _callback_error(handler: Callable, name: str, exc: Exception) -> CallbackError:
    """Name the callback (class or function) and the event in the error a handler raised."""
    owner = getattr(handler, "__self__", None)
    who = type(owner).__name__ if owner is not None else getattr(handler, "__qualname__", repr(handler))
    return CallbackError(f"callback {who} raised {type(exc).__name__} during {name}: {exc}")


def normalise_callbacks(callbacks: Any) -> list[Callback]:
    """``callbacks=`` accepts None, one Callback, or a list of them."""
    if callbacks is None:
        return []
    if isinstance(callbacks, Callback):
        return [callbacks]
    if isinstance(callbacks, (list, tuple)):
        return list(callbacks)
    raise ConfigurationError(
        f"callbacks={callbacks!r} is not accepted; pass a Callback, a list of Callbacks, or None."
    )
