"""The Metric base class: named numpy elements that sum/max/min across processes.

A metric keeps its running state in *elements* registered in ``__init__``.
Because every element has a fixed shape and a declared reduction, the Evaluator
can aggregate any metric across processes with one ``all_reduce`` per element,
without knowing what the metric computes.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any

import numpy as np

from .._common import ConfigurationError, DrivetrainError

AGGREGATES = ("sum", "max", "min")

AllReduce = Callable[[np.ndarray, str], np.ndarray]
"""``all_reduce(array, op) -> array``, e.g. ``driver.all_reduce``; the identity for one process."""


class MetricInputError(DrivetrainError, ValueError):
    """``Metric.update`` received arrays it cannot use (shapes that disagree, labels out of range)."""


class Metric(abc.ABC):
    """Base class of evaluation metrics.

    Subclasses call ``super().__init__()`` and then :meth:`register_element` for
    each piece of state, implement :meth:`update` (numpy arrays in, matched by
    parameter name from the batch and the model's outputs) and :meth:`get_metric`
    (a flat ``{name: float}`` dict, read after :meth:`aggregate`).
    Registered elements read and write like attributes: ``self.correct += n``.
    """

    result_names: tuple[str, ...] | None = None
    """Keys :meth:`get_metric` returns, when known before running (checks ``monitor=`` early)."""

    def __init__(self) -> None:
        object.__setattr__(self, "_elements", {})
        object.__setattr__(self, "_initial", {})
        object.__setattr__(self, "_aggregate_ops", {})

    # ------------------------------------------------------------------ elements
    def register_element(self, name: str, value: Any = 0.0, aggregate: str = "sum") -> None:
        """Declare a piece of state of fixed shape, reset to ``value`` and reduced with ``aggregate``.

        Call it in ``__init__``; the element then reads and writes as ``self.<name>``.

        Args:
            name: the element's name, a valid attribute name.
            value: its initial value (a number or an array: the shape stays fixed).
            aggregate: how processes combine it: ``"sum"``, ``"max"`` or ``"min"``.

        Raises:
            ConfigurationError: a bad name or aggregate, or ``super().__init__()`` was not called.
        """
        elements = self.__dict__.get("_elements")
        if elements is None:
            raise ConfigurationError(
                f"{type(self).__name__}.register_element({name!r}) was called before Metric.__init__; "
                "call super().__init__() first in your __init__."
            )
        if not isinstance(name, str) or not name.isidentifier() or name.startswith("_"):
            raise ConfigurationError(
                f"register_element(name={name!r}): the name must be a Python identifier not starting with '_'."
            )
        if name in elements:
            raise ConfigurationError(f"register_element(name={name!r}): an element of that name is already registered.")
        if hasattr(type(self), name) or name in self.__dict__:
            raise ConfigurationError(
                f"register_element(name={name!r}) would hide the attribute {type(self).__name__}.{name}; "
                "choose another name."
            )
        if aggregate not in AGGREGATES:
            raise ConfigurationError(
                f"register_element({name!r}, aggregate={aggregate!r}) is not accepted; use one of {', '.join(AGGREGATES)}."
            )
        initial = np.array(value)
        if initial.dtype.kind not in "biuf":
            raise ConfigurationError(
                f"register_element({name!r}, value={value!r}): the value must be a number or a numeric array, "
                f"got dtype {initial.dtype}."
            )
        self._initial[name] = initial
        self._aggregate_ops[name] = aggregate
        elements[name] = initial.copy()

    def __getattr__(self, name: str) -> Any:
        # Only called when normal lookup fails, so methods and plain attributes cost nothing extra.
        elements = self.__dict__.get("_elements")
        if elements is not None and name in elements:
            return elements[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        elements = self.__dict__.get("_elements")
        if elements is not None and name in elements:
            elements[name] = self._coerce(name, value)
        else:
            object.__setattr__(self, name, value)

    def _coerce(self, name: str, value: Any) -> np.ndarray:
        """Keep an element's shape and dtype fixed, so every process reduces the same layout."""
        current = self._elements[name]
        array = np.asarray(value)
        if array.shape != current.shape:
            raise MetricInputError(
                f"{type(self).__name__}.{name} has shape {current.shape}; cannot assign a value of shape "
                f"{array.shape}. Elements keep the shape they were registered with."
            )
        if array.dtype != current.dtype:
            try:
                array = array.astype(current.dtype, casting="same_kind")
            except TypeError:
                raise MetricInputError(
                    f"{type(self).__name__}.{name} holds {current.dtype}; cannot store a {array.dtype} value "
                    "without losing precision. Register the element with a float initial value."
                ) from None
        return array

    @property
    def elements(self) -> dict[str, np.ndarray]:
        """A copy of every element's current value, by name."""
        return {k: v.copy() for k, v in self._elements.items()}

    def reset(self) -> None:
        """Restore every element to a copy of its registered value (called before each evaluation)."""
        for name, initial in self._initial.items():
            self._elements[name] = initial.copy()

    def aggregate(self, all_reduce: AllReduce) -> None:
        """Reduce every element across processes in place; call once per evaluation, before get_metric.

        Calling it twice without :meth:`reset` reduces twice (sums would count twice
        in a distributed run).

        Args:
            all_reduce: ``all_reduce(array, op) -> array``, e.g. ``driver.all_reduce``.

        Raises:
            MetricInputError: ``all_reduce`` changed an element's shape.
        """
        for name, value in self._elements.items():
            reduced = np.asarray(all_reduce(value, self._aggregate_ops[name]))
            if reduced.size != value.size:
                raise MetricInputError(
                    f"all_reduce returned shape {reduced.shape} for {type(self).__name__}.{name} of shape "
                    f"{value.shape}; the driver's all_reduce must keep the shape."
                )
            self._elements[name] = reduced.reshape(value.shape).astype(value.dtype, copy=True)

    # --------------------------------------------------------------- subclasses
    @abc.abstractmethod
    def update(self, *args: Any, **kwargs: Any) -> None:
        """Add one batch; the evaluator passes the batch and output values the parameters name.

        Args:
            *args: a subclass names its inputs, e.g. ``update(self, pred, target)``: each is a numpy array
                taken from the batch or the outputs by that name.
            **kwargs: a ``**kwargs`` parameter receives every batch and output value.
        """

    @abc.abstractmethod
    def get_metric(self) -> dict[str, float]:
        """The results from the (aggregated) elements.

        Returns:
            ``{result name: float}``; the evaluator keys them ``result#metric#dataloader``.
        """

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def prepare_labels(
    pred: Any, target: Any, seq_len: Any, *, metric: str, num_classes: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Return flat ``(pred_ids, target_ids)`` of the positions that count.

    ``pred`` holds class ids (the shape of ``target``) or scores with one more
    trailing dimension (argmax is taken). ``seq_len`` (shape ``(batch,)``) keeps
    the first ``seq_len[i]`` positions of row ``i`` along axis 1.
    """
    pred = np.asarray(pred)
    target = np.asarray(target)
    if pred.ndim == target.ndim + 1:
        if pred.shape[:-1] != target.shape:
            raise MetricInputError(
                f"{metric}.update: pred has shape {pred.shape} and target {target.shape}; scores must have the "
                "target's shape plus one trailing class dimension."
            )
        if num_classes is not None and pred.shape[-1] != num_classes:
            raise MetricInputError(
                f"{metric}.update: pred scores have {pred.shape[-1]} classes in the last dimension "
                f"(shape {pred.shape}) but num_classes={num_classes}."
            )
        pred = pred.argmax(axis=-1)
    elif pred.shape != target.shape:
        raise MetricInputError(
            f"{metric}.update: pred has shape {pred.shape} and target {target.shape}; pass class ids of the "
            "target's shape, or scores with one more trailing dimension."
        )
    if seq_len is None:
        return pred.reshape(-1), target.reshape(-1)
    mask = sequence_mask(seq_len, target.shape, metric=metric)
    return pred[mask], target[mask]


def sequence_mask(seq_len: Any, shape: tuple[int, ...], *, metric: str) -> np.ndarray:
    """Boolean mask of ``shape`` that is True for the first ``seq_len[i]`` positions of row ``i``."""
    seq_len = np.asarray(seq_len)
    if len(shape) < 2:
        raise MetricInputError(
            f"{metric}.update: seq_len was given but target has shape {shape}; seq_len masks padded positions "
            "of a (batch, length, ...) target. Pass seq_len=None for one label per sample."
        )
    if seq_len.shape != (shape[0],) or seq_len.dtype.kind not in "iub":
        raise MetricInputError(
            f"{metric}.update: seq_len must be integers of shape ({shape[0]},) for target of shape {shape}; "
            f"got shape {seq_len.shape}, dtype {seq_len.dtype}."
        )
    if seq_len.size and (seq_len.min() < 0 or seq_len.max() > shape[1]):
        raise MetricInputError(
            f"{metric}.update: seq_len values must lie in [0, {shape[1]}] (the padded length of target "
            f"{shape}); got min {seq_len.min()}, max {seq_len.max()}."
        )
    mask = np.arange(shape[1])[None, :] < seq_len[:, None]
    return np.broadcast_to(mask.reshape(mask.shape + (1,) * (len(shape) - 2)), shape)
