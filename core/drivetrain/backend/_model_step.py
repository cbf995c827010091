"""One batch through the model, the same way for training, evaluation and prediction.

A :class:`ModelStep` resolves the function to call (a method of the model or a function of the batch's values),
applies ``input_mapping`` once per batch (so the model, the metrics and the callbacks see the same batch), names
tuple batches by the function's parameters, runs the function in the driver's precision, applies
``output_mapping``, and, for training with ``loss_fn``, adds ``"loss"`` to the outputs. The Trainer hands its step
to :meth:`Driver.forward_backward`; a functional framework calls :attr:`fn` itself inside its gradient transform.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from .._mapping import make_batch_namer, make_mapping_fn, named_outputs, require_loss


class Driver(Protocol):
    """What a step asks of its driver (a :class:`~drivetrain.backend.Driver` has it all)."""

    model_wo_auto_param_call: bool

    def get_model_call_fn(self, fn_name: str | None, default: str) -> tuple[Callable, Callable]: ...
    def move_data_to_device(self, batch: Any) -> Any: ...
    def auto_cast(self) -> AbstractContextManager: ...
    def model_call(self, batch: Any, fn: Callable, signature_fn: Callable | None) -> Any: ...


@dataclass(frozen=True)
class ArgumentNames:
    """How the user spells the mapping arguments where this loop was configured (for error messages)."""

    input_mapping: str = "input_mapping"
    output_mapping: str = "output_mapping"


class ModelStep:
    """Map, name and call: one batch in, the mapped outputs (with the loss, for training) out.

    Args:
        driver: the driver whose model is called.
        fn_name: the model's method to call (None: ``default``, else the framework's forward), or a function of
            the batch's values.
        default: the method used when the model has it and ``fn_name`` is None (``"train_step"``, ...).
        input_mapping: the user's ``input_mapping`` (a function or a dict of renames) or None.
        output_mapping: the user's ``output_mapping`` or None.
        names: how the user spelled the mapping arguments, for messages.
        what: the function's role in messages (``"train function"``).
        loss_fn: ``loss_fn(outputs, batch) -> loss`` for a model that returns no loss; None otherwise.
    """

    def __init__(self, driver: Driver, fn_name: str | Callable | None, default: str, input_mapping: Any,
                 output_mapping: Any, names: ArgumentNames, what: str,
                 loss_fn: Callable[[Any, Any], Any] | None = None) -> None:
        self.driver = driver
        self.names = names
        self.what = what
        self.loss_fn = loss_fn
        self.fn_name = fn_name if isinstance(fn_name, str) else None
        if callable(fn_name):  # a function of the batch's values instead of a method of the model
            self.fn = self.signature_fn = fn_name
        else:
            self.fn, self.signature_fn = driver.get_model_call_fn(fn_name, default=default)
        self.input_fn = make_mapping_fn(input_mapping, names.input_mapping)
        self.output_fn = make_mapping_fn(output_mapping, names.output_mapping,
                                         to_dict=lambda outputs: named_outputs(outputs, what))
        self.namer = make_batch_namer(self.signature_fn, driver.model_wo_auto_param_call)
        self._plain: bool | None = None  # whether the driver's precision needs no context (known at the first call)

    def prepare(self, batch: Any) -> Any:
        """Move ``batch`` to the device, apply the input mapping and name a tuple batch."""
        batch = self.driver.move_data_to_device(batch)
        if self.input_fn is not None:
            batch = self.input_fn(batch)
        if self.namer is not None:
            batch = self.namer(batch)
        return batch

    def call(self, batch: Any) -> Any:
        """Run the function on a prepared batch in the driver's precision; return the mapped outputs, with
        ``loss_fn(outputs, batch)`` as ``"loss"`` beside the named outputs when a ``loss_fn`` was given."""
        driver = self.driver
        if self._plain is None:
            self._plain = type(driver.auto_cast()) is contextlib.nullcontext
        if self._plain:
            outputs = driver.model_call(batch, self.fn, self.signature_fn)
        else:
            with driver.auto_cast():
                outputs = driver.model_call(batch, self.fn, self.signature_fn)
        if self.output_fn is not None:
            outputs = self.output_fn(outputs)
        if self.loss_fn is not None:
            outputs = {**named_outputs(outputs, self.what), "loss": self.loss_fn(outputs, batch)}
        return outputs

    def loss(self, outputs: Any) -> Any:
        """The loss in what :meth:`call` returned (a dict's ``"loss"``, an output object's loss, or the value).

        Raises:
            BatchMismatchError: the outputs hold no loss; the message suggests ``output_mapping`` or ``loss_fn``.
        """
        if type(outputs) is dict and "loss" in outputs:
            return outputs["loss"]
        return require_loss(outputs, self.what)
