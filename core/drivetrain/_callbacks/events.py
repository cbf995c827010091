"""The trainer's events, defined once: their names, the arguments they pass, and filters.

``Event.on_train_batch_end(every=10)`` is a value: an event name plus an optional
filter (``every`` n-th call, ``once``, or ``filter_fn(trainer) -> bool``). The same
value registers a handler through ``Trainer.on``, ``Trainer.add_callback_fn`` or
the ``callbacks=`` list; a :class:`~drivetrain.Callback` subclass overrides the
method of the same name.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from .._common import ConfigurationError, did_you_mean

# name -> parameters after ``trainer``, in the order they are passed. Listed in firing order.
EVENT_ARGS: dict[str, tuple[str, ...]] = {
    "on_after_trainer_initialized": ("driver",),
    "on_sanity_check_begin": (),
    "on_sanity_check_end": ("sanity_check_res",),
    "on_train_begin": (),
    "on_train_epoch_begin": (),
    "on_fetch_data_begin": (),
    "on_fetch_data_end": (),
    "on_train_batch_begin": ("batch", "indices"),
    "on_before_backward": ("outputs",),
    "on_after_backward": (),
    "on_before_optimizers_step": ("optimizers",),
    "on_after_optimizers_step": ("optimizers",),
    "on_before_zero_grad": ("optimizers",),
    "on_after_zero_grad": ("optimizers",),
    "on_train_batch_end": (),
    "on_evaluate_begin": (),
    "on_evaluate_end": ("results",),
    "on_train_epoch_end": (),
    "on_exception": ("exception",),
    "on_train_end": (),
    "on_save_model": (),
    "on_load_model": (),
    "on_save_checkpoint": (),
    "on_load_checkpoint": ("states",),
}


# what each argument a handler receives holds; the Args: section of every event's docstring
ARGUMENT_DOCS: dict[str, str] = {
    "trainer": "the `Trainer` firing the event (its counters, `driver`, `optimizers`, `model`).",
    "driver": "the trainer's `Driver`, built and set up.",
    "sanity_check_res": "the sanity evaluation's results dict, keyed `metric#element#dataloader`.",
    "batch": "the batch, already on the device.",
    "indices": "its samples' positions in the dataset (a list of ints) under a reproducible sampler, else None.",
    "outputs": "the model's outputs after `output_mapping`, before the loss is backpropagated.",
    "optimizers": "the trainer's optimizers, a list.",
    "results": "the evaluation's results dict, keyed `metric#element#dataloader` (`{\"acc#acc#dev\": 0.93}`).",
    "exception": "the exception that ended training (an `EarlyStopException` when a callback stopped it).",
    "states": "each callback's saved state, keyed by its `callback_name`.",
}


def event_arguments(name: str) -> str:
    """The Google-style ``Args:`` section of a handler of event ``name``: ``trainer`` and the event's arguments."""
    lines = [f"    {arg}: {ARGUMENT_DOCS[arg]}" for arg in ("trainer",) + EVENT_ARGS[name]]
    return "Args:\n" + "\n".join(lines)


def unknown_event_message(name: str) -> str:
    """``name`` is no event: the closest event names, then all of them."""
    hint = did_you_mean(name, EVENT_ARGS, n=3) if isinstance(name, str) else ""
    return f"{name!r} is not an event.{hint} Events: {', '.join(EVENT_ARGS)}."


class _EventClass(type):
    """Makes ``Event.on_trian_begin()`` a ConfigurationError that lists the events, not a bare AttributeError."""

    def __getattr__(cls, name: str) -> Any:
        # Only called when normal lookup fails. Private and dunder names keep the AttributeError that
        # hasattr(), copy, pickle and introspection tools rely on.
        if name.startswith("_"):
            raise AttributeError(f"type object 'Event' has no attribute {name!r}")
        raise ConfigurationError(f"Event.{name}: {unknown_event_message(name)}")


class Event(metaclass=_EventClass):
    """An event name with an optional filter; build one with ``Event.on_<name>(...)``.

    At most one of ``every``, ``once`` and ``filter_fn`` may be given.

    Args:
        name: the event, one of the ``on_*`` names below (``"on_train_batch_end"``).
        every: run the handler on every n-th firing only (``every=100``: the 100th, 200th, ...).
        once: run the handler on the first firing only.
        filter_fn: ``filter_fn(trainer) -> bool``; the handler runs when it returns True.

    Raises:
        ConfigurationError: for an unknown event name (the message lists the closest ones), more than one
            filter, ``every`` below 1 or a ``filter_fn`` that is not callable.
    """

    __slots__ = ("name", "every", "once", "filter_fn")

    def __init__(
        self,
        name: str,
        every: int | None = None,
        once: bool | None = None,
        filter_fn: Callable[[Any], bool] | None = None,
    ) -> None:
        if not isinstance(name, str) or name not in EVENT_ARGS:
            raise ConfigurationError(f"Event({name!r}): {unknown_event_message(name)}")
        given = [k for k, v in (("every", every), ("once", once), ("filter_fn", filter_fn)) if v]
        if len(given) > 1:
            raise ConfigurationError(f"Event.{name}() takes one of every/once/filter_fn, got {given}.")
        if every is not None and (not isinstance(every, int) or isinstance(every, bool) or every < 1):
            raise ConfigurationError(f"Event.{name}(every={every!r}): every must be an int >= 1.")
        if filter_fn is not None and not callable(filter_fn):
            raise ConfigurationError(f"Event.{name}(filter_fn={filter_fn!r}): filter_fn must be callable(trainer) -> bool.")
        self.name = name
        self.every = every
        self.once = bool(once)
        self.filter_fn = filter_fn

    @property
    def is_filtered(self) -> bool:
        """Whether ``every``, ``once`` or ``filter_fn`` restricts when a handler of this event runs."""
        return bool(self.every and self.every > 1) or self.once or self.filter_fn is not None

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={getattr(self, k)!r}" for k in ("every", "once", "filter_fn") if getattr(self, k))
        return f"Event.{self.name}({opts})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Event) and (self.name, self.every, self.once, self.filter_fn) == (
            other.name, other.every, other.once, other.filter_fn)

    def __hash__(self) -> int:
        return hash((self.name, self.every, self.once))


def _event_factory(name: str) -> staticmethod:
    def factory(every: int | None = None, once: bool | None = None,
                filter_fn: Callable[[Any], bool] | None = None) -> Event:
        return Event(name, every=every, once=once, filter_fn=filter_fn)

    args = ", ".join(("trainer",) + EVENT_ARGS[name])
    factory.__name__ = factory.__qualname__ = name
    factory.__doc__ = (
        f"The event ``{name}``: its handlers are called as ``fn({args})``.\n\n"
        "Args:\n"
        "    every: run the handler on every n-th firing only.\n"
        "    once: run the handler on the first firing only.\n"
        "    filter_fn: ``filter_fn(trainer) -> bool``; the handler runs when it returns True.\n\n"
        "Returns:\n"
        "    The `Event`, for `Trainer.on` or `Trainer.add_callback_fn`.\n\n"
        "Raises:\n"
        "    ConfigurationError: for more than one filter, ``every`` below 1 or a ``filter_fn`` that is not callable.")
    return staticmethod(factory)


for _name in EVENT_ARGS:
    setattr(Event, _name, _event_factory(_name))


def check_handler_signature(fn: Callable, event: str, where: str) -> None:
    """Fail now, not when the event first fires, if ``fn`` cannot take the event's arguments."""
    expected = ("trainer",) + EVENT_ARGS[event]
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    try:
        sig.bind(*expected)
    except TypeError:
        raise ConfigurationError(
            f"{where}: {getattr(fn, '__qualname__', fn)}{sig} cannot be called for {event}; "
            f"it receives ({', '.join(expected)})."
        ) from None


class FilteredHandler:
    """Calls ``fn`` only when the event's filter lets the call through."""

    __slots__ = ("fn", "event", "num_called", "num_executed", "__qualname__")

    def __init__(self, fn: Callable, event: Event) -> None:
        self.fn = fn
        self.event = event
        self.num_called = 0
        self.num_executed = 0
        self.__qualname__ = getattr(fn, "__qualname__", repr(fn))

    def __call__(self, trainer: Any, *args: Any) -> Any:
        self.num_called += 1
        event = self.event
        if event.once:
            run = self.num_executed == 0
        elif event.every:
            run = self.num_called % event.every == 0
        elif event.filter_fn is not None:
            run = bool(event.filter_fn(trainer))
        else:
            run = True
        if run:
            self.num_executed += 1
            return self.fn(trainer, *args)
        return None
