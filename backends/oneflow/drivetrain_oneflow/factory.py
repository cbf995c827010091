"""The factory the plugin points at: builds the single-process or the distributed oneflow driver.

It lives apart from both drivers so that neither imports the other: :mod:`.distributed`
builds on :mod:`.driver`, and only this module knows both. Importing :mod:`.driver` first
refuses a Python or oneflow that cannot work (before oneflow is imported); the
distributed modules (:mod:`._dist_plan`, :mod:`._launch`, :mod:`.distributed`) are
imported only when they are needed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .driver import FRAMEWORK_KWARGS, OneflowSingleDriver, _check_framework_kwargs, check_model


def create_driver(
    model: Any,
    device: Any,
    *,
    nproc: int | None = None,
    precision: str = "fp32",
    grad_clip: float | None = None,
    grad_clip_type: str = "norm",
    model_wo_auto_param_call: bool = False,
    framework_kwargs: Mapping[str, Any] | None = None,
) -> OneflowSingleDriver:
    """Build the oneflow driver for ``model`` on ``device`` (see :mod:`._device` for devices).

    The distributed driver (:class:`~drivetrain_oneflow.distributed.OneflowDDPDriver`) is chosen
    under ``oneflow.distributed.launch`` (``WORLD_SIZE > 1``) and in processes the Trainer
    started; ``nproc > 1`` or a list of several devices in a plain ``python train.py`` makes
    this process start and supervise the workers (:mod:`._launch`), and it never returns.
    """
    check_model(model)
    if framework_kwargs is not None and not isinstance(framework_kwargs, Mapping):
        _check_framework_kwargs(framework_kwargs, FRAMEWORK_KWARGS)
    from ._dist_plan import plan_distributed

    plan = plan_distributed(model, device, nproc, framework_kwargs or {})
    options = dict(precision=precision, grad_clip=grad_clip, grad_clip_type=grad_clip_type,
                   model_wo_auto_param_call=model_wo_auto_param_call, framework_kwargs=framework_kwargs)
    if plan is not None and plan.launch == "spawn":
        from ._launch import supervise

        supervise(plan)  # exits this process with the workers' verdict
    if plan is not None:
        from .distributed import OneflowDDPDriver

        return OneflowDDPDriver(model, plan, **options)
    if isinstance(device, (list, tuple)):
        device = device[0]
    return OneflowSingleDriver(model, device, **options)
