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

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import paddle
import safetensors

from drivetrain.backend import (
    DriverError,
    listed_names,
    loadable_gradients,
    loadable_model_state,
)

# paddle dtype -> safetensors tag; numpy has no bfloat16/float8, paddle hands those over as
# uint16/int8 arrays holding the same bits.
_TAGS: dict[Any, str] = {
    paddle.float64: "F64", paddle.float32: "F32", paddle.float16: "F16", paddle.bfloat16: "BF16",
    paddle.int64: "I64", paddle.int32: "I32", paddle.int16: "I16", paddle.int8: "I8", paddle.uint8: "U8",
    paddle.bool: "BOOL", paddle.complex64: "C64",
    paddle.float8_e4m3fn: "F8_E4M3", paddle.float8_e5m2: "F8_E5M2",
}
# safetensors tag -> (numpy dtype the bytes are read as, paddle dtype to reinterpret them as, or None)
_READ: dict[str, tuple[Any, Any]] = {
    "F64": (np.float64, None), "F32": (np.float32, None), "F16": (np.float16, None),
    "BF16": (np.int16, paddle.bfloat16), "I64": (np.int64, None), "I32": (np.int32, None),
    "I16": (np.int16, None), "I8": (np.int8, None), "U8": (np.uint8, None), "BOOL": (np.bool_, None),
    "C64": (np.complex64, None), "F8_E4M3": (np.int8, paddle.float8_e4m3fn),
    "F8_E5M2": (np.int8, paddle.float8_e5m2),
}
_BITS_AS = {"BF16": paddle.int16, "F8_E4M3": paddle.int8, "F8_E5M2": paddle.int8}
"""Dtypes numpy lacks, reinterpreted (no copy) as an integer type of the same width for the byte view."""
_ITEM_SIZES = {"F64": 8, "I64": 8, "C64": 8, "F32": 4, "I32": 4, "F16": 2, "BF16": 2, "I16": 2,
               "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


def _shape(tensor: paddle.Tensor) -> list[int]:
    return list(tensor.shape)


def as_tensor(value: Any, where: str) -> paddle.Tensor:
    """A paddle tensor from a paddle tensor or a numpy array (checkpoints may hold either)."""
    if isinstance(value, paddle.Tensor):
        return value
    if isinstance(value, np.ndarray):
        return paddle.to_tensor(np.ascontiguousarray(value), place=paddle.CPUPlace())
    raise DriverError(f"{where} is a {type(value).__name__}; the paddle driver needs paddle tensors (or numpy arrays).")


# ------------------------------------------------------------------------ model
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
        tensor = paddle.to_tensor(np.ascontiguousarray(tensor), place=paddle.CPUPlace())
    if not isinstance(tensor, paddle.Tensor):
        raise DriverError(
            f"is a {type(tensor).__name__}, not a paddle tensor; put only tensors in a tensor file "
            "(other values belong in the checkpoint's JSON manifest)."
        )
    tag = _TAGS.get(tensor.dtype)
    if tag is None:
        raise DriverError(f"has dtype {tensor.dtype}, which safetensors cannot store.")
    shape = tuple(int(n) for n in tensor.shape)
    tensor = tensor.detach()
    if not tensor.place.is_cpu_place():
        tensor = tensor.cpu()
    bits = _BITS_AS.get(tag)
    if bits is not None:
        tensor = tensor.view(bits)
    try:
        array = np.from_dlpack(tensor)
    except (BufferError, RuntimeError, TypeError):  # a dtype or layout DLPack cannot express: copy
        array = tensor.numpy()
    array = np.ascontiguousarray(array)
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    return tag, shape, memoryview(array.reshape(-1).view(np.uint8))


def tensors_from_bytes(data: bytes) -> dict[str, paddle.Tensor]:
    """Parse safetensors bytes into CPU paddle tensors (safetensors' own parser; nothing is unpickled)."""
    out: dict[str, paddle.Tensor] = {}
    for name, info in safetensors.deserialize(bytes(data)):
        tag = info["dtype"]
        if tag not in _READ:
            raise DriverError(f"tensor {name!r} has dtype {tag}, which the paddle driver cannot load.")
        read_as, view_as = _READ[tag]
        shape = [int(n) for n in info["shape"]]
        raw = info["data"]
        if len(raw) != math.prod(shape) * _ITEM_SIZES[tag]:
            raise DriverError(f"tensor {name!r}: {len(raw)} bytes do not fit dtype {tag} and shape {shape}.")
        array = np.frombuffer(raw, dtype=np.dtype(read_as).newbyteorder("<")).reshape(shape)
        tensor = paddle.to_tensor(array.astype(read_as), place=paddle.CPUPlace())  # a copy paddle owns
        out[name] = tensor if view_as is None else tensor.view(view_as)
    return out


# --------------------------------------------------------------------- gradients
def gradient_state(model: paddle.nn.Layer) -> dict[str, paddle.Tensor]:
    """Copies of the existing gradients by structured parameter name, on the CPU."""
    grads: dict[str, paddle.Tensor] = {}
    for name, param in model.named_parameters():
        grad = param.grad
        if grad is None:
            continue
        grad = grad.detach()
        grads[name] = grad.clone() if grad.place.is_cpu_place() else grad.cpu()
    return grads


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
def parameters_of(optimizer: paddle.optimizer.Optimizer) -> list[paddle.Tensor]:
    """Every parameter an optimizer updates, over all its parameter groups."""
    groups = getattr(optimizer, "_param_groups", None)
    if groups and isinstance(groups[0], Mapping):
        return [p for group in groups for p in group["params"]]
    return list(getattr(optimizer, "_parameter_list", None) or [])


def lr_multipliers(optimizer: paddle.optimizer.Optimizer, where: str) -> list[float]:
    """Each param group's ``learning_rate``: paddle's fixed multiplier of the optimizer's one rate (1 without groups)."""
    groups = getattr(optimizer, "_param_groups", None)
    if not groups or not isinstance(groups[0], Mapping):
        return [1.0]
    multipliers = []
    for g, group in enumerate(groups):
        value = group.get("learning_rate", 1.0)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise DriverError(
                f"{where}: param group {g} has learning_rate={value!r:.60}, not a number; the paddle driver reads "
                "a param group's learning_rate as a multiplier of the optimizer's rate."
            )
        multipliers.append(float(value))
    return multipliers


def learning_rates(optimizer: paddle.optimizer.Optimizer, where: str) -> list[float]:
    """The rate each param group steps with: the optimizer's rate times the group's multiplier."""
    rate = float(optimizer.get_lr())
    return [rate * m for m in lr_multipliers(optimizer, where)]


def rate_for(optimizer: paddle.optimizer.Optimizer, rates: list[float], where: str) -> float:
    """The optimizer's one rate with which each group steps with ``rates`` (they must keep the groups' ratios)."""
    scheduler = optimizer._learning_rate
    if isinstance(scheduler, paddle.optimizer.lr.LRScheduler):
        raise DriverError(
            f"{where} takes its learning rate from a paddle {type(scheduler).__name__}, which set_lrs cannot override. "
            "Build the optimizer with a float learning_rate (e.g. learning_rate=1e-3) to use a drivetrain schedule "
            "such as WarmupSchedule, or keep the paddle scheduler and step it with LRSchedulerCallback(scheduler)."
        )
    multipliers = lr_multipliers(optimizer, where)
    reference = next((j for j, m in enumerate(multipliers) if m != 0.0), None)
    rate = optimizer.get_lr() if reference is None else rates[reference] / multipliers[reference]
    if not all(math.isclose(r, rate * m, rel_tol=1e-9, abs_tol=1e-30) for r, m in zip(rates, multipliers, strict=True)):
        raise DriverError(
            f"set_lrs: {where} gets rates {rates}, but paddle keeps one learning rate per optimizer and each param "
            f"group's learning_rate is a fixed multiplier of it ({multipliers}); pass rates in those ratios, or give "
            "the groups separate optimizers."
        )
    return float(rate)


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
    if not isinstance(state, Mapping) or "accumulators" not in state:
        raise DriverError(
            f"{where} is a {type(state).__name__} without 'accumulators'; it must be what the paddle driver's "
            "optimizer_states() returned (a checkpoint of another driver cannot be loaded)."
        )
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
