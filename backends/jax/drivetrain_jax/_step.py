"""The compiled step: a model's variables read and written without walking its graph, and the ``jax.jit`` programs
that compute a batch's loss and gradients, apply the optimizer, and run a forward.

``nnx.jit`` splits and merges the whole graph on every call (about a millisecond for a small model on this CPU,
more than the step itself). The driver instead splits the model once per mode (train/eval change static
attributes, so the graph definition) into groups of ``nnx.Variable`` objects, passes their raw values to plain
``jax.jit`` programs that merge them into a model *inside* the trace, and writes the new values back into the
same variable objects, so the user's model always holds the current state. The arithmetic is the one an
``nnx.jit`` loop compiles, so both give bit-identical parameters.

Programs are kept for the whole process, like ``nnx.jit``'s cache, keyed by what their trace depends on (the
graph definitions, the filters, the train function and its mappings); they hold no model. What a trace calls
(the ModelStep, the driver counting compilations) is handed over in :data:`TRACE` just before each call.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from drivetrain.backend import DriverError

TRACE = threading.local()
"""``TRACE.call(model, batch)`` and ``TRACE.traces`` (a Counter) of the driver calling a program: read only while
jax traces it (a first call, or a new batch shape)."""
PROGRAMS: dict[tuple, Callable] = {}
"""The compiled programs of this process, by key."""


def program(key: tuple, build: Callable[[], Callable]) -> Callable:
    """The program of ``key``, built (and later compiled by jax) the first time it is asked for."""
    found = PROGRAMS.get(key)
    if found is None:
        if len(PROGRAMS) > 256:  # models built and dropped by the hundred: start over rather than grow
            PROGRAMS.clear()
        found = PROGRAMS[key] = build()
    return found


def dotted(path: tuple) -> str:
    """A variable's name in drivetrain's files: its graph path joined by dots (``layers.0.kernel``)."""
    return ".".join(str(part) for part in path)


def _is_variable(node: Any) -> bool:
    return isinstance(node, nnx.Variable)


class Layout:
    """How a graph node's variables split into groups by filters (the last ``...`` takes the rest): what a program
    needs to rebuild the node inside a trace (``merge``) and read a group back (``read``); no variable, no model."""

    def __init__(self, graphdef: Any, trees: list[Any], filters: tuple) -> None:
        self.graphdef, self.trees, self.filters = graphdef, trees, filters
        self.key = (graphdef, filters, *trees)

    def state(self, group: int, values: list[Any]) -> Any:
        return jax.tree.unflatten(self.trees[group], jax.tree.leaves(values))

    def merge(self, values: list[list[Any]]) -> Any:
        return nnx.merge(self.graphdef, *(self.state(group, v) for group, v in enumerate(values)))

    def read(self, node: Any, group: int) -> list[Any]:
        state = nnx.split(node, *self.filters)[1 + group]
        if jax.tree.structure(state) != self.trees[group]:
            raise DriverError(
                "the model created or removed variables while it ran (nnx.sow, a new attribute, a cache): the jax "
                "driver compiles a step over a fixed set of variables. Create every variable in __init__ (sow only "
                "inside nnx.capture).")
        return [variable.get_raw_value() for variable in jax.tree.leaves(state, is_leaf=_is_variable)]


class Split:
    """A graph node's variables grouped by ``filters``, in graph order, with their names and :class:`Layout`:
    ``values(i)`` reads group ``i``'s raw values, ``write(i, values)`` puts new ones into the same variables."""

    def __init__(self, node: Any, *filters: Any) -> None:
        graphdef, *states = nnx.split(node, *filters)
        self.layout = Layout(graphdef, [jax.tree.structure(state) for state in states], filters)
        self.variables = [jax.tree.leaves(state, is_leaf=_is_variable) for state in states]
        flat = [nnx.to_flat_state(state) for state in states]
        self.names = [[dotted(path) for path, _ in group] for group in flat]
        self.programs: dict[tuple, Callable] = {}  # found once per split: no graph definition hashed per step
        if not all(len(group) == len(variables) and all(v is w for (_, v), w in zip(group, variables, strict=True))
                   for group, variables in zip(flat, self.variables, strict=True)):  # names and values must agree
            raise DriverError("the jax driver could not list the model's variables in one order; please report it "
                              "with your flax version.")

    def values(self, group: int) -> list[Any]:
        return [variable.get_raw_value() for variable in self.variables[group]]

    def all_values(self) -> list[list[Any]]:
        return [self.values(group) for group in range(len(self.variables))]

    def write(self, group: int, values: list[Any]) -> None:
        # outside any trace (the driver's own calls), so flax's check of the trace level, which costs more than the
        # rest of the write, can be skipped
        for variable, value in zip(self.variables[group], values, strict=True):
            variable.set_raw_value(value, _unsafe_bypass_check=True)

    def program(self, local: tuple, key: tuple, build: Callable[[], Callable]) -> Callable:
        """:func:`program` ``key``, remembered here under the cheaper ``local`` key."""
        found = self.programs.get(local)
        if found is None:
            found = self.programs[local] = program(key, build)
        return found


def split_batch(batch: Any) -> tuple[list[Any], Any]:
    """A batch's arrays (traced) and the rest (``static``: its structure and every other leaf, which must be
    hashable), so a batch may carry strings or ids beside its arrays."""
    leaves, treedef = jax.tree.flatten(batch)
    arrays = [leaf for leaf in leaves if isinstance(leaf, (jax.Array, np.ndarray, np.generic))]
    if len(arrays) == len(leaves):
        return arrays, (treedef, ())
    return arrays, (treedef, tuple((i, leaf) for i, leaf in enumerate(leaves)
                                   if not isinstance(leaf, (jax.Array, np.ndarray, np.generic))))


def join_batch(arrays: list[Any], static: Any) -> Any:
    treedef, others = static
    leaves = list(arrays)
    for index, leaf in others:
        leaves.insert(index, leaf)
    return jax.tree.unflatten(treedef, leaves)


def step_call(step: Any, rebind: Callable[[Any], Callable]) -> Callable[[Any, Any], tuple[Any, Any]]:
    """``call(model, batch) -> (outputs, loss)``: the Trainer's ``ModelStep`` (input names, output mapping,
    ``loss_fn``) with its function taken from the traced ``model`` instead of the user's."""

    def call(model: Any, batch: Any) -> tuple[Any, Any]:
        inner = copy.copy(step)
        inner.fn = rebind(model)
        outputs = inner.call(batch)
        return outputs, inner.loss(outputs)

    return call


def _gradients(layout: Layout, values: list, arrays: list, static: Any, divisor: Any) -> tuple:
    """Traced: ``(outputs, mutable values, gradients of group 0)`` of the loss (divided by ``divisor`` unless None)."""
    TRACE.traces["train"] += 1
    call = TRACE.call
    trained, frozen, mutable = values

    def loss_of(trained: list) -> tuple:
        model = layout.merge([trained, frozen, mutable])
        outputs, loss = call(model, join_batch(arrays, static))
        return (loss if divisor is None else loss / divisor), (outputs, layout.read(model, 2))

    (_, (outputs, mutable)), grads = jax.value_and_grad(loss_of, has_aux=True)(trained)
    return outputs, mutable, grads


def _update(layout: Layout, optimizer: Layout, values: list, opt_values: list, grads: list, clip: float | None,
            clip_type: str) -> tuple:
    """Traced: ``(trained values, optimizer values, norm)`` after clipping ``grads`` as torch clips them (the norm's
    factor ``min(1, clip / (norm + 1e-6))``) and ``optimizer.update(model, grads)``."""
    model, opt = layout.merge(values), optimizer.merge([opt_values])
    norm = None
    if clip is not None and clip_type == "norm":
        norm = optax.tree.norm(grads)
        factor = jnp.minimum(1.0, clip / (norm + 1e-6))
        grads = jax.tree.map(lambda g: g * factor.astype(g.dtype), grads)
    elif clip is not None:
        grads = jax.tree.map(lambda g: jnp.clip(g, -clip, clip), grads)
    opt.update(model, layout.state(0, grads))
    return layout.read(model, 0), optimizer.read(opt, 0), norm


def grad_program(layout: Layout) -> Callable:
    """``program(values, arrays, acc, divisor, static) -> (outputs, mutable values, gradients)``: a batch of an
    accumulation cycle, its gradients added to ``acc`` (unless None)."""

    def program(values: list, arrays: list, acc: Any, divisor: Any, static: Any) -> tuple:
        outputs, mutable, grads = _gradients(layout, values, arrays, static, divisor)
        return outputs, mutable, (grads if acc is None else jax.tree.map(jnp.add, acc, grads))

    return jax.jit(program, static_argnames="static")


def update_program(layout: Layout, optimizer: Layout, clip: float | None, clip_type: str) -> Callable:
    """``program(values, optimizer values, grads) -> (trained values, optimizer values, norm)``."""

    def program(values: list, opt_values: list, grads: list) -> tuple:
        TRACE.traces["update"] += 1
        return _update(layout, optimizer, values, opt_values, grads, clip, clip_type)

    return jax.jit(program)


def fused_program(layout: Layout, optimizer: Layout, clip: float | None, clip_type: str) -> Callable:
    """``program(values, optimizer values, arrays, static) -> (outputs, mutable, (trained, optimizer values, norm))``:
    a batch's gradients and the optimizer step they lead to, in one program with the outputs of the usual ``nnx.jit``
    train step (the gradients are not one: returning them changes XLA's fusion, and so the last bits)."""

    def program(values: list, opt_values: list, arrays: list, static: Any) -> tuple:
        outputs, mutable, grads = _gradients(layout, values, arrays, static, None)
        return outputs, mutable, _update(layout, optimizer, values, opt_values, grads, clip, clip_type)

    return jax.jit(program, static_argnames="static")


def call_program(layout: Layout) -> Callable:
    """``program(values, arrays, static) -> (outputs, mutable values)``: ``TRACE.call(model, batch)`` on the traced
    model (evaluation and prediction forwards, compiled like training's)."""

    def program(values: list, arrays: list, static: Any) -> tuple:
        TRACE.traces["call"] += 1
        model = layout.merge(values)
        return TRACE.call(model, join_batch(arrays, static)), layout.read(model, 2)

    return jax.jit(program, static_argnames="static")
