"""The factory the plugin points at: builds the single-process or the distributed paddle driver.

It lives apart from both drivers so that neither imports the other: :mod:`.distributed`
builds on :mod:`.driver`, and only this module knows both. The distributed modules
(:mod:`._dist_plan`, :mod:`.distributed`) are imported only when they are needed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .driver import FRAMEWORK_KWARGS, PaddleSingleDriver, _check_framework_kwargs, _check_model


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
) -> PaddleSingleDriver:
    """Build the paddle driver for ``model`` on ``device`` (see :mod:`drivetrain_paddle._device` for devices).

    ``framework_kwargs`` holds paddle-only options (:data:`.driver.FRAMEWORK_KWARGS`, plus
    :data:`~drivetrain_paddle._dist_plan.DIST_KWARGS` when distributed); the Trainer's
    ``paddle_kwargs=`` arrives here under that name. The distributed driver
    (:class:`~drivetrain_paddle.distributed.PaddleDataParallelDriver`) is chosen when the
    parallel environment is already initialised, under paddle's launcher with more than
    one process, for a list of several devices, or for ``nproc > 1``; otherwise one
    process drives one device (a one-element device list means that device).
    """
    _check_model(model)
    if framework_kwargs is not None and not isinstance(framework_kwargs, Mapping):
        _check_framework_kwargs(framework_kwargs, FRAMEWORK_KWARGS)
    from ._dist_plan import plan_distributed

    plan = plan_distributed(model, device, nproc, framework_kwargs or {})
    options = dict(precision=precision, grad_clip=grad_clip, grad_clip_type=grad_clip_type,
                   model_wo_auto_param_call=model_wo_auto_param_call, framework_kwargs=framework_kwargs)
    if plan is not None:
        from .distributed import PaddleDataParallelDriver

        return PaddleDataParallelDriver(model, plan, **options)
    if isinstance(device, (list, tuple)):
        device = device[0]
    return PaddleSingleDriver(model, device, **options)
