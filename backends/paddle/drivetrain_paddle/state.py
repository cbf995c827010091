"""Model, gradient and optimizer state for the paddle backend, and tensor files, without pickle.

Names. paddle gives every parameter a process-wide name (``linear_0.w_0``) from a
global counter, and its optimizers key their state by it: a model rebuilt in the same
process gets new names (``linear_3.w_0``) and ``Optimizer.set_state_dict`` no longer
finds its moments. Everything here is keyed by the model's *structured* names
(``fc1.weight``, from ``named_parameters``), which depend only on the architecture.

Optimizer state. An optimizer creates its accumulators (moments, velocities, beta
powers) lazily, at its first step. Loading a checkpoint into a fresh optimizer
therefore *materialises* each saved accumulator for the matching parameter of this
model (through the optimizer's own ``_add_accumulator``, so it is the tensor the
optimizer will find and use) and fills it with the saved value; accumulators the
checkpoint does not have are created fresh at the first step, as in the original run.

Files. Tensors go to disk as safetensors (raw bytes plus a JSON header, so reading a
file never runs code): :func:`tensor_buffer` hands each tensor's bytes to the core's
writer, :func:`tensors_from_bytes` parses them back. ``paddle.save``/``paddle.load``
(pickle) are never used.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import paddle
import safetensors

from drivetrain.backend import (
    DriverError,
    array_buffer,
    check_file_tensor,
    check_optimizer_state,
    dtype_tags,
    file_dtype_tag,
    group_multipliers,
    listed_names,
    loadable_gradients,
    loadable_model_state,
    safetensors_arrays,
    shared_rate,
    tensor_from,
)

# paddle dtype -> safetensors tag; numpy has no bfloat16/float8, paddle hands those over as
# int16/int8 arrays holding the same bits.
_TAGS = dtype_tags(paddle, ("float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8",
                            "bool", "complex64", "float8_e4m3fn", "float8_e5m2"))
_DTYPES = {tag: dtype for dtype, tag in _TAGS.items()}
_BITS_AS = {"BF16": paddle.int16, "F8_E4M3": paddle.int8, "F8_E5M2": paddle.int8}
"""Dtypes numpy lacks, reinterpreted (no copy) as an integer type of the same width for the byte view."""
_READ_BITS = {"BF16": np.int16, "F8_E4M3": np.int8, "F8_E5M2": np.int8}
"""The numpy dtype those are read from a file as, before paddle reinterprets them."""


def _shape(tensor: paddle.Tensor) -> list[int]:
    return list(tensor.shape)


def as_tensor(value: Any, where: str) -> paddle.Tensor:
    """A paddle tensor from a paddle tensor or a numpy array (checkpoints may hold either)."""
    return tensor_from(value, where, tensor_type=paddle.Tensor, from_numpy=_cpu_tensor, framework="paddle")


def _cpu_tensor(array: np.ndarray) -> paddle.Tensor:
    return paddle.to_tensor(array, place=paddle.CPUPlace())


# ------------------------------------------------------------------------ model
_BATCH_NORMS = (paddle.nn.layer.norm._BatchNormBase, paddle.nn.BatchNorm)


def frozen_parameter_names(model: paddle.nn.Layer) -> set[str]:
    """The state names of the parameters with ``stop_gradient=True`` (paddle's frozen, e.g. ``trainable=False``),
    less batch norms' running statistics: paddle keeps them as parameters that take no gradient, but the
    forward pass updates them, so they change while training and are saved like buffers."""
    statistics = {f"{prefix}.{name}" if prefix else name
                  for prefix, layer in model.named_sublayers(include_self=True) if isinstance(layer, _BATCH_NORMS)
                  for name in ("_mean", "_variance")}
    return {name for name, p in model.named_parameters() if p.stop_gradient and name not in statistics}


def model_state(model: paddle.nn.Layer) -> dict[str, paddle.Tensor]:
    """The model's ``state_dict`` (parameters and persistable buffers) by structured name, detached."""
    return {name: tensor.detach() for name, tensor in model.state_dict().items()}


def load_model_state(model: paddle.nn.Layer, state: Mapping[str, Any]) -> None:
    """Copy ``state`` into ``model``; names and shapes must match exactly, dtypes are cast to the model's."""
    expected = model.state_dict()
    prepared = loadable_model_state(state, expected, type(model).__name__, as_tensor=as_tensor, shape=_shape,
                                    cast=lambda value, dtype: value.astype(dtype))
    for name, target in expected.items():
        target.set_value(prepared[name])  # copies onto the parameter's own place; identity is kept


# ------------------------------------------------------------------ tensor files
def tensor_buffer(tensor: Any) -> tuple[str, tuple[int, ...], memoryview]:
    """``(safetensors dtype tag, shape, C-contiguous bytes on the host)`` of a paddle tensor or numpy array.

    A contiguous CPU tensor is handed over without a copy (a DLPack view of its memory,
    which the view keeps alive); a GPU tensor is copied to the host once. bfloat16 and
    float8 tensors -- which numpy cannot hold -- are viewed as int16 / int8 of the same
    bits first, and tagged with their real dtype.
    """
    if isinstance(tensor, np.ndarray):
        tensor = _cpu_tensor(np.ascontiguousarray(tensor))
    check_file_tensor(tensor, paddle.Tensor, "a paddle tensor")
    tag = file_dtype_tag(tensor.dtype, _TAGS)
    shape = tuple(int(n) for n in tensor.shape)
    tensor = tensor.detach() if tensor.place.is_cpu_place() else tensor.detach().cpu()
    if tag in _BITS_AS:
        tensor = tensor.view(_BITS_AS[tag])
    try:
        array = np.from_dlpack(tensor)
    except (BufferError, RuntimeError, TypeError):  # a dtype or layout DLPack cannot express: copy
        array = tensor.numpy()
    return tag, shape, array_buffer(array, tag)[2]


def tensors_from_bytes(data: bytes) -> dict[str, paddle.Tensor]:
    """Parse safetensors bytes into CPU paddle tensors (safetensors' own parser; nothing is unpickled)."""
    out: dict[str, paddle.Tensor] = {}
    entries = safetensors.deserialize(bytes(data))
    for name, tag, array in safetensors_arrays(entries, _DTYPES, "the paddle driver cannot load", _READ_BITS):
        tensor = _cpu_tensor(array)  # a copy paddle owns
        out[name] = tensor.view(_DTYPES[tag]) if tag in _BITS_AS else tensor
    return out


# --------------------------------------------------------------------- gradients
def gradient_copy(grad: paddle.Tensor) -> paddle.Tensor:
    """A CPU copy of a parameter's gradient (by structured parameter name in the state)."""
    return grad.clone() if grad.place.is_cpu_place() else grad.cpu()


def load_gradient_state(model: paddle.nn.Layer, grads: Mapping[str, Any]) -> None:
    """Give each named parameter its saved gradient (on the parameter's place and dtype), the others none."""
    params = dict(model.named_parameters())
    prepared = loadable_gradients(
        grads, params, type(model).__name__, as_tensor=as_tensor, shape=_shape,
        place=lambda grad, param: _on_place_of(param, grad.astype(param.dtype) if grad.dtype != param.dtype else grad))
    for name, param in params.items():
        param.grad = prepared.get(name)


def _on_place_of(reference: paddle.Tensor, tensor: paddle.Tensor) -> paddle.Tensor:
    """A fresh copy of ``tensor`` on ``reference``'s place."""
    place = reference.place
    if place.is_gpu_place():
        return tensor.cuda(place.gpu_device_id(), blocking=True)
    if place.is_cpu_place():
        return tensor.detach().clone().cpu()
    raise DriverError(f"parameters on {place} are not supported by the paddle driver.")


# --------------------------------------------------------------------- optimizers
def _groups(optimizer: paddle.optimizer.Optimizer) -> list[Mapping[str, Any]] | None:
    """The optimizer's param groups (dicts), or None when it was built from a plain list of parameters."""
    groups = getattr(optimizer, "_param_groups", None)
    return groups if groups and isinstance(groups[0], Mapping) else None


def parameters_of(optimizer: paddle.optimizer.Optimizer) -> list[paddle.Tensor]:
    """Every parameter an optimizer updates, over all its parameter groups."""
    groups = _groups(optimizer)
    if groups:
        return [p for group in groups for p in group["params"]]
    return list(getattr(optimizer, "_parameter_list", None) or [])


def lr_multipliers(optimizer: paddle.optimizer.Optimizer, where: str) -> list[float]:
    """Each param group's ``learning_rate``: paddle's fixed multiplier of the optimizer's one rate (1 without groups)."""
    return group_multipliers(_groups(optimizer), where, framework="paddle")


def rate_for(optimizer: paddle.optimizer.Optimizer, rates: list[float], where: str) -> float:
    """The optimizer's one rate with which each group steps with ``rates`` (they must keep the groups' ratios)."""
    scheduler = optimizer._learning_rate
    if isinstance(scheduler, paddle.optimizer.lr.LRScheduler):
        raise DriverError(
            f"{where} takes its learning rate from a paddle {type(scheduler).__name__}, which set_lrs cannot override. "
            "Build the optimizer with a float learning_rate (e.g. learning_rate=1e-3) to use a drivetrain schedule "
            "such as WarmupSchedule, or keep the paddle scheduler and step it with LRSchedulerCallback(scheduler)."
        )
    return shared_rate(rates, lr_multipliers(optimizer, where), optimizer.get_lr(), where, framework="paddle")


def _owners(model: paddle.nn.Layer, optimizer: paddle.optimizer.Optimizer) -> dict[str, tuple[str, paddle.Tensor]]:
    """paddle name -> (structured name, tensor) for this model's parameters and the optimizer's master weights."""
    owners = {param.name: (name, param) for name, param in model.named_parameters()}
    for pname, master in (getattr(optimizer, "_master_weights", None) or {}).items():
        if pname in owners:
            owners[master.name] = (f"{owners[pname][0]}@master", master)
    return owners


def _acc_base(optimizer: Any, key: str) -> str:
    """An accumulator key without the optimizer's ``name=`` prefix (``_add_accumulator`` adds it again)."""
    prefix = f"{optimizer._name}_" if getattr(optimizer, "_name", None) else ""
    return key[len(prefix):] if prefix and key.startswith(prefix) else key


def optimizer_state(model: paddle.nn.Layer, optimizer: paddle.optimizer.Optimizer, where: str) -> dict[str, Any]:
    """One optimizer's state keyed by structured names: accumulators, master weights, learning rate."""
    if getattr(optimizer, "_use_multi_tensor", False):
        raise DriverError(
            f"{where}: {type(optimizer).__name__}(use_multi_tensor=True) keeps its state in fused buffers that "
            "drivetrain cannot checkpoint; build the optimizer with use_multi_tensor=False."
        )
    owners = _owners(model, optimizer)
    accumulators: dict[str, dict[str, paddle.Tensor]] = {}
    on_cpu: list[str] = []  # accumulators paddle keeps on the CPU next to GPU parameters (Adam's beta powers)
    for key, per_param in optimizer._accumulators.items():
        base = _acc_base(optimizer, key)
        entries = {}
        for pname, tensor in per_param.items():
            if pname not in owners:
                raise DriverError(
                    f"{where}: the optimizer holds state ({base!r}) for a parameter named {pname!r} that is not "
                    f"a parameter of the model {type(model).__name__}; an optimizer may only update the model's "
                    "own parameters when its state is checkpointed."
                )
            name, owner = owners[pname]
            entries[name] = tensor.detach()
            if tensor.place.is_cpu_place() and not owner.place.is_cpu_place() and base not in on_cpu:
                on_cpu.append(base)
        accumulators[base] = entries
    state: dict[str, Any] = {"accumulators": accumulators, "accumulators_on_cpu": on_cpu}
    masters = getattr(optimizer, "_master_weights", None) or {}
    if masters:
        state["master_weights"] = {owners[p][0]: t.detach() for p, t in masters.items() if p in owners}
    scheduler = optimizer._learning_rate
    if isinstance(scheduler, paddle.optimizer.lr.LRScheduler):
        state["lr_scheduler"] = scheduler.state_dict()
    else:
        state["learning_rate"] = float(optimizer.get_lr())
    return state


def load_optimizer_state(model: paddle.nn.Layer, optimizer: paddle.optimizer.Optimizer, state: Any,
                         where: str) -> None:
    """Put :func:`optimizer_state` back into ``optimizer`` (fresh or already stepped)."""
    check_optimizer_state(state, where, ["accumulators"], "paddle")
    params = dict(model.named_parameters())
    accumulators = state["accumulators"]
    on_cpu = set(state.get("accumulators_on_cpu", ()))
    unknown = sorted({n for per in accumulators.values() for n in per if n.split("@")[0] not in params})
    unknown += sorted(n for n in state.get("master_weights", {}) if n.split("@")[0] not in params)
    if unknown:
        raise DriverError(
            f"{where} holds state for parameter(s) {listed_names(unknown)} that the model {type(model).__name__} "
            "does not have; build the same model and optimizer as the run that saved the checkpoint."
        )
    targets: dict[str, paddle.Tensor] = dict(params)
    masters = state.get("master_weights") or {}
    if masters and not hasattr(optimizer, "_master_weights"):
        raise DriverError(f"{where} holds master weights but {type(optimizer).__name__} keeps none.")
    for name, value in masters.items():  # first: accumulators of fp16 parameters belong to their master weight
        param = params[name]
        existing = optimizer._master_weights.get(param.name)
        tensor = as_tensor(value, f"{where}['master_weights'][{name!r}]").astype("float32")
        if existing is not None:
            existing.set_value(tensor)
        else:
            optimizer._master_weights[param.name] = _on_place_of(param, tensor)
        targets[f"{name}@master"] = optimizer._master_weights[param.name]
    for base, per_param in accumulators.items():
        for name, value in per_param.items():
            target = targets.get(name)
            if target is None:
                raise DriverError(f"{where}: accumulator {base!r} of {name!r} has no parameter to belong to.")
            saved = as_tensor(value, f"{where}['accumulators'][{base!r}][{name!r}]")
            accumulator = optimizer._add_accumulator(  # the existing one, or a new one the optimizer will find
                base, target, dtype=saved.dtype, shape=list(saved.shape),
                device="cpu" if base in on_cpu else None)
            if list(accumulator.shape) != list(saved.shape):
                raise DriverError(
                    f"{where}: accumulator {base!r} of {name!r} has shape {list(saved.shape)} in the checkpoint "
                    f"but {list(accumulator.shape)} here; the parameter's size changed."
                )
            accumulator.set_value(saved if saved.dtype == accumulator.dtype else saved.astype(accumulator.dtype))
    scheduler = optimizer._learning_rate
    if isinstance(scheduler, paddle.optimizer.lr.LRScheduler):
        if state.get("lr_scheduler") is not None:
            scheduler.set_state_dict(dict(state["lr_scheduler"]))
    elif state.get("learning_rate") is not None:
        optimizer.set_lr(float(state["learning_rate"]))
