"""The factory the plugin points at: checks the model and options, builds the one-process or the data-parallel driver.

It is the one module that knows both drivers; the distributed one (:mod:`.distributed`) is imported only when
the launch asks for several processes (``nproc=N``, a list of devices, or a launcher's environment).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
from flax import nnx

from drivetrain.backend import Driver, DriverError, parse_device_arg, unknown_device

from .precision import check_precision

ACCEPTED_DEVICES = "None (jax's default device), 'cpu', 'gpu', 'cuda', 'cuda:N', an int N or a jax.Device"
SINGLE_KWARGS = {"compile_evaluation": "bool (default True): compile evaluation and prediction forwards like "
                 "training's; False runs them eagerly (a model whose evaluation cannot be traced)"}


def resolve_device(device: Any, given: str | None = None) -> Any:
    """``device=`` as a ``jax.Device`` (None: jax's default device, where arrays go unless told otherwise)."""
    if device is None or isinstance(device, jax.Device):
        return device
    parsed = parse_device_arg(device, ACCEPTED_DEVICES, given)
    if parsed is None:
        raise unknown_device(device, ACCEPTED_DEVICES, "jax")
    kind, index = parsed
    if kind == "cpu":
        return jax.local_devices(backend="cpu")[0]
    try:
        gpus = jax.local_devices(backend="gpu")
    except RuntimeError:
        gpus = []
    if not gpus or (index or 0) >= len(gpus):
        raise DriverError(f"{given or f'device={device!r}'}: jax sees {len(gpus)} GPU(s) here ({jax.devices()}); "
                          "install a CUDA build (pip install 'jax[cuda12]') or pass device='cpu'.")
    return gpus[index or 0]


def create_driver(model: Any, device: Any, *, nproc: int | None = None, precision: str = "fp32",
                  grad_clip: float | None = None, grad_clip_type: str = "norm",
                  model_wo_auto_param_call: bool = False, framework_kwargs: Any = None) -> Driver:
    """Build the jax driver for ``model`` (a ``flax.nnx.Module``): the data-parallel one when the launch asks for
    several processes, else :class:`~drivetrain_jax.driver.JaxDriver` on ``device``."""
    if not isinstance(model, nnx.Module):
        linen = " (a flax.linen Module: wrap it with nnx.bridge.ToNNX, or write it with flax.nnx)" if \
            type(model).__module__.startswith("flax") else ""
        raise DriverError(f"model={type(model).__qualname__} is not a flax.nnx.Module{linen}; the jax driver trains "
                          "nnx.Module models.")
    check_precision(precision)
    if framework_kwargs is not None and not isinstance(framework_kwargs, Mapping):
        raise DriverError(f"jax_kwargs={framework_kwargs!r} must be a dict of options.")
    options = dict(framework_kwargs or {})
    single = {key: options.pop(key) for key in list(options) if key in SINGLE_KWARGS}
    for key, value in single.items():
        if not isinstance(value, bool):
            raise DriverError(f"jax_kwargs[{key!r}]={value!r} must be True or False.")
    common = dict(precision=precision, grad_clip=grad_clip, grad_clip_type=grad_clip_type,
                  model_wo_auto_param_call=model_wo_auto_param_call, **single)
    from ._dist_plan import DIST_KWARGS, plan_distributed

    unknown = sorted(set(options) - set(DIST_KWARGS))
    if unknown:
        accepted = "; ".join(f"{key}: {meaning}" for key, meaning in {**SINGLE_KWARGS, **DIST_KWARGS}.items())
        raise DriverError(f"jax_kwargs has unknown key(s) {unknown}; accepted: {accepted}.")
    plan = plan_distributed(model, device, nproc, options)
    if plan is not None and plan.launch == "spawn":
        from ._launch import supervise, worker_command

        # runs the script as nproc workers and exits this process with their verdict
        supervise(plan.world_size, worker_command(), plan.timeout, plan.spawn_output)
    if plan is not None:
        from .distributed import JaxDataParallelDriver

        return JaxDataParallelDriver(model, plan, **common)
    if options:
        raise DriverError(f"jax_kwargs {sorted(options)} apply to several processes only (nproc=N, a device list "
                          "or a launcher); this run has one.")
    if isinstance(device, (list, tuple)):
        device = device[0] if device else None
    from .driver import JaxDriver

    return JaxDriver(model, resolve_device(device), **common)
