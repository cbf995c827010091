"""Model, gradient and optimizer state for the jittor backend, and tensor files, all without pickle.

``jt.save``/``Module.save`` pickle; they are never used. Tensors go to disk as
safetensors (raw bytes and a JSON header, so reading a file never runs code):
:func:`tensor_buffer` hands each tensor's bytes to the core's writer and
:func:`tensors_from_bytes` parses them back.

Names. Everything is keyed by the model's structured names (``layers.0.weight``, from
``Module.state_dict``). ``load_model_state`` is strict -- jittor's own
``load_parameters`` only logs a warning for a name or shape that does not fit.

Gradients. A jittor optimizer keeps the accumulated gradient of each parameter in its
param group (``group["grads"]``) plus a private flag saying whether they are stale
(``zero_grad`` only sets the flag). :func:`gradient_state` reads them when they are
live; :func:`load_gradient_state` writes them back and sets the flag to match.

Optimizer state. jittor's ``Optimizer.state_dict`` holds the live parameter Vars and is
keyed by position. Here a state is ``{"attributes": hyper-parameters (lr, n_step,
betas, ...), "groups": [{"options": per-group numbers, "slots": {slot: {parameter
name: tensor}}}]}``: every per-parameter list of a group (``values``, ``m`` and so on)
is a slot, keyed by the parameter's structured name.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Any

import numpy as np
import safetensors

from drivetrain.backend import (
    DriverError,
    array_buffer,
    bf16_bits,
    check_file_tensor,
    check_gradient_shape,
    check_optimizer_state,
    file_dtype_tag,
    listed_names,
    loadable_model_state,
    tensor_from,
    widened_tensors,
)

_ZERO_FLAG = "_Optimizer__zero_grad"
"""jittor's private flag: True when the optimizer's stored gradients are stale (after zero_grad/step)."""
_NOT_SLOTS = ("params", "grads")

# jittor dtype name -> safetensors tag (bfloat16 travels as the high half of float32's bits)
_TAGS = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16", "int64": "I64",
         "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL"}
_JT_DTYPES = {tag: name for name, tag in _TAGS.items()}


def _jt() -> Any:
    import jittor

    return jittor


def as_var(value: Any, where: str, dtype: str | None = None) -> Any:
    """A jittor Var from a Var or a numpy array (checkpoints may hold either), cast to ``dtype`` if given."""
    value = tensor_from(value, where, tensor_type=_jt().Var, from_numpy=_from_numpy, framework="jittor", noun="Vars")
    if dtype is not None and str(value.dtype) != dtype:
        value = value.cast(dtype)
    return value


def _from_numpy(array: np.ndarray) -> Any:
    return _jt().array(array, dtype=str(array.dtype))  # jt.array alone makes int64 int32


def to_numpy(var: Any) -> np.ndarray:
    """A host copy of a Var; bfloat16 (which numpy lacks) becomes float32, exactly."""
    if str(var.dtype) == "bfloat16":
        return var.float32().numpy()
    return var.numpy()


# ------------------------------------------------------------------------ model
_RUNNING_STATISTICS = ("running_mean", "running_var")


def frozen_parameter_names(model: Any) -> set[str]:
    """The state names of the parameters jittor does not train (``stop_grad()``, ``requires_grad=False``), less
    normalisation layers' running statistics: jittor lists them among the parameters, stopped, but the
    forward pass updates them, so they change while training and are saved like buffers."""
    statistics = {f"{prefix}.{name}" if prefix else name for prefix, module in model.named_modules()
                  for name in _RUNNING_STATISTICS if hasattr(module, name)}
    return {name for name, p in model.named_parameters() if not p.requires_grad and name not in statistics}


def model_state(model: Any) -> dict[str, Any]:
    """The model's persistent Vars (parameters and buffers) by structured name; the live Vars, no copy."""
    return dict(model.state_dict())


def load_model_state(model: Any, state: Mapping[str, Any]) -> None:
    """Copy ``state`` into ``model``'s Vars (identity kept); names and shapes must match exactly."""
    expected = model.state_dict()
    prepared = loadable_model_state(state, expected, type(model).__name__, as_tensor=as_var,
                                    shape=lambda var: list(var.shape), cast=lambda var, dtype: var.cast(dtype))
    for name, target in expected.items():
        target.update(prepared[name])
    _jt().sync(list(expected.values()))


# ------------------------------------------------------------------ tensor files
def tensor_buffer(tensor: Any) -> tuple[str, tuple[int, ...], memoryview]:
    """``(safetensors dtype tag, shape, C-contiguous bytes on the host)`` of a Var or numpy array.

    jittor hands a Var's values over as a new numpy array (one host copy); bfloat16 is
    written as the high 16 bits of its exact float32 value.
    """
    if isinstance(tensor, np.ndarray):
        tensor = as_var(tensor, "tensor")
    check_file_tensor(tensor, _jt().Var, "a jittor Var")
    tag = file_dtype_tag(str(tensor.dtype), _TAGS)
    array = to_numpy(tensor)
    if tag == "BF16":
        array = bf16_bits(array)
    return tag, tuple(int(n) for n in tensor.shape), array_buffer(array, tag)[2]


def tensors_from_bytes(data: bytes) -> dict[str, Any]:
    """Parse safetensors bytes into jittor Vars (safetensors' own parser; nothing is unpickled)."""
    return widened_tensors(safetensors.deserialize(bytes(data)), _JT_DTYPES, "the jittor driver cannot load",
                           _from_numpy, lambda var: var.bfloat16())


# --------------------------------------------------------------------- helpers
def parameters_of(optimizer: Any) -> list[Any]:
    """Every parameter an optimizer holds, over all its param groups."""
    return [p for group in optimizer.param_groups for p in group["params"]]


def gradients_live(optimizer: Any) -> bool:
    """Whether the optimizer's stored gradients belong to backward calls since the last zero_grad/step."""
    return not getattr(optimizer, _ZERO_FLAG, True)


def _names_by_id(model: Any) -> dict[int, str]:
    return {id(var): name for name, var in model.state_dict().items()}


def _name_of(names: dict[int, str], param: Any, where: str) -> str:
    name = names.get(id(param))
    if name is None:
        raise DriverError(
            f"{where}: the optimizer holds a parameter (shape {list(param.shape)}) that is not a Var of the model; "
            "its state cannot be keyed by name. Build the optimizer from model.parameters()."
        )
    return name


# --------------------------------------------------------------------- gradients
def gradient_state(model: Any, optimizers: list[Any]) -> dict[str, Any]:
    """Copies of the live accumulated gradients by parameter name (none after zero_grad or step)."""
    jt = _jt()
    names = _names_by_id(model)
    grads: dict[str, Any] = {}
    for k, optimizer in enumerate(optimizers):
        if not gradients_live(optimizer):
            continue
        for group in optimizer.param_groups:
            for param, grad in zip(group["params"], group.get("grads", ()), strict=False):
                if param.is_stop_grad():
                    continue
                grads[_name_of(names, param, f"gradient_state (optimizers[{k}])")] = jt.array(grad.numpy())
    return grads


def load_gradient_state(model: Any, optimizers: list[Any], grads: Mapping[str, Any]) -> None:
    """Give each named parameter its saved gradient; an optimizer none of whose parameters is named gets none."""
    jt = _jt()
    if not isinstance(grads, Mapping):
        raise DriverError(
            f"load_gradient_state(grads={type(grads).__name__}) needs a dict of parameter name -> tensor, "
            "as returned by gradient_state()."
        )
    names = _names_by_id(model)
    held = {names.get(id(p)) for opt in optimizers for p in parameters_of(opt)}
    unknown = [name for name in grads if name not in held]
    if unknown:
        raise DriverError(
            f"load_gradient_state: no optimizer of the model {type(model).__name__} holds parameter(s) "
            f"{listed_names(unknown)}; the gradients were saved from a different model or optimizer setup."
        )
    for k, optimizer in enumerate(optimizers):
        mine = False
        for group in optimizer.param_groups:
            if "grads" not in group:  # what jittor's backward creates on its first call
                group["grads"] = [jt.zeros_like(p).stop_grad().stop_fuse() for p in group["params"]]
            for i, param in enumerate(group["params"]):
                name = _name_of(names, param, f"load_gradient_state (optimizers[{k}])")
                if name not in grads:
                    group["grads"][i].update(jt.zeros_like(param).stop_grad())
                    continue
                value = as_var(grads[name], f"load_gradient_state: grads[{name!r}]", str(param.dtype))
                check_gradient_shape(name, list(value.shape), list(param.shape))
                group["grads"][i].update(value.stop_grad())
                mine = True
        setattr(optimizer, _ZERO_FLAG, not mine)


# --------------------------------------------------------------------- optimizers
def plain_value(value: Any) -> bool:
    """A value the checkpoint manifest stores as JSON: numbers, strings, None, and tuples/lists of them."""
    if value is None or isinstance(value, (bool, str, numbers.Number)):
        return True
    return isinstance(value, (list, tuple)) and all(plain_value(v) for v in value)


def optimizer_state(model: Any, optimizer: Any, where: str) -> dict[str, Any]:
    """One optimizer's state keyed by structured names (see the module docstring)."""
    jt = _jt()
    names = _names_by_id(model)
    attributes = {k: v for k, v in vars(optimizer).items()
                  if not k.startswith("_") and k != "param_groups" and plain_value(v)}
    groups = []
    for g, group in enumerate(optimizer.param_groups):
        params = group["params"]
        keys = [_name_of(names, p, f"{where}.param_groups[{g}]") for p in params]
        options: dict[str, Any] = {}
        slots: dict[str, dict[str, Any]] = {}
        for key, value in group.items():
            if key in _NOT_SLOTS:
                continue
            if isinstance(value, list) and len(value) == len(params) and all(isinstance(v, jt.Var) for v in value):
                slots[key] = dict(zip(keys, value, strict=True))
            elif plain_value(value):
                options[key] = value
            else:
                raise DriverError(
                    f"{where}: param_groups[{g}][{key!r}] is a {type(value).__name__}, neither a number nor one Var "
                    "per parameter, so it cannot be checkpointed without pickle."
                )
        groups.append({"parameters": keys, "options": options, "slots": slots})
    return {"type": type(optimizer).__name__, "attributes": attributes, "groups": groups}


def load_optimizer_state(model: Any, optimizer: Any, state: Any, where: str) -> None:
    """Put :func:`optimizer_state` back into ``optimizer`` (fresh or already stepped)."""
    check_optimizer_state(state, where, ["groups", "attributes"], "jittor")
    if state.get("type") not in (None, type(optimizer).__name__):
        raise DriverError(
            f"{where} was saved from a {state['type']} but this optimizer is a {type(optimizer).__name__}; pass the "
            "same kind of optimizer as the run that saved the checkpoint."
        )
    names = _names_by_id(model)
    groups = state["groups"]
    if len(groups) != len(optimizer.param_groups):
        raise DriverError(
            f"{where} holds {len(groups)} param group(s) but the optimizer has {len(optimizer.param_groups)}; build "
            "the optimizer with the same groups as the run that saved the checkpoint."
        )
    for g, (saved, group) in enumerate(zip(groups, optimizer.param_groups, strict=True)):
        keys = [_name_of(names, p, f"{where}.param_groups[{g}]") for p in group["params"]]
        if list(saved.get("parameters", [])) != keys:
            raise DriverError(
                f"{where}: param group {g} was saved over parameters {listed_names(list(saved.get('parameters', [])))} "
                f"but holds {listed_names(keys)} here; build the optimizer over the same parameters, in the same order."
            )
        for key, per_param in saved.get("slots", {}).items():
            current = group.get(key)
            fresh = not isinstance(current, list) or len(current) != len(keys)
            values = []
            for name, param in zip(keys, group["params"], strict=True):
                value = as_var(per_param[name], f"{where}[{key!r}][{name!r}]")
                if list(value.shape) != list(param.shape) and list(value.shape) != [1]:
                    raise DriverError(
                        f"{where}: slot {key!r} of {name!r} has shape {list(value.shape)} in the checkpoint but the "
                        f"parameter has shape {list(param.shape)}; the parameter's size changed."
                    )
                values.append(value.stop_grad())
            if fresh:
                group[key] = values
            else:
                for target, value in zip(current, values, strict=True):
                    target.update(value.cast(str(target.dtype)) if str(target.dtype) != str(value.dtype) else value)
        for key, value in saved.get("options", {}).items():
            group[key] = tuple(value) if isinstance(group.get(key), tuple) else value
    for key, value in state["attributes"].items():
        if isinstance(getattr(optimizer, key, None), tuple) and isinstance(value, list):
            value = tuple(value)
        setattr(optimizer, key, value)
