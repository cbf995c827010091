"""The factory the plugin points at: builds the single-process or the distributed paddle driver.

It lives apart from both drivers so that neither imports the other: :mod:`.distributed`
builds on :mod:`.driver`, and only this module knows both. The data-parallel driver
(:mod:`.distributed`) is imported only when it is needed: when the parallel environment is
already initialised, under paddle's launcher with more than one process, for a list of
several devices, or for ``nproc > 1``.
"""

from __future__ import annotations

from drivetrain.backend import module_driver_factory, planned_distributed

from .driver import PaddleSingleDriver

create_driver = module_driver_factory(PaddleSingleDriver, planned_distributed(
    "drivetrain_paddle._dist_plan:plan_distributed", "drivetrain_paddle.distributed:PaddleDataParallelDriver"))
"""Build the paddle driver for ``model`` on ``device`` (see :mod:`drivetrain_paddle._device` for devices).

``framework_kwargs`` holds paddle-only options (:data:`.driver.FRAMEWORK_KWARGS`, plus
:data:`~drivetrain_paddle._dist_plan.DIST_KWARGS` when distributed); the Trainer's
``paddle_kwargs=`` arrives here under that name.
"""
