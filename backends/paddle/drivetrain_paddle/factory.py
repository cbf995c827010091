"""The factory the plugin points at: builds the single-process or the distributed paddle driver.

It lives apart from both drivers so that neither imports the other: :mod:`.distributed`
builds on :mod:`.driver`, and only this module knows both. The distributed driver
(:mod:`.distributed`) is imported only when it is needed.
"""

from __future__ import annotations

from typing import Any

from drivetrain.backend import Driver, module_driver_factory

from ._dist_plan import plan_distributed
from .driver import PaddleSingleDriver


def _distributed(model: Any, device: Any, nproc: int | None, options: dict[str, Any]) -> Driver | None:
    """The data-parallel driver when the parallel environment is already initialised, under paddle's launcher
    with more than one process, for a list of several devices, or for ``nproc > 1``; else None."""
    plan = plan_distributed(model, device, nproc, options["framework_kwargs"] or {})
    if plan is None:
        return None
    from .distributed import PaddleDataParallelDriver

    return PaddleDataParallelDriver(model, plan, **options)


create_driver = module_driver_factory(PaddleSingleDriver, _distributed)
"""Build the paddle driver for ``model`` on ``device`` (see :mod:`drivetrain_paddle._device` for devices).

``framework_kwargs`` holds paddle-only options (:data:`.driver.FRAMEWORK_KWARGS`, plus
:data:`~drivetrain_paddle._dist_plan.DIST_KWARGS` when distributed); the Trainer's
``paddle_kwargs=`` arrives here under that name.
"""
