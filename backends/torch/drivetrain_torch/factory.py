"""The factory the plugin points at: builds the single-process or the distributed torch driver.

It lives apart from both drivers so that neither imports the other: :mod:`.distributed`
builds on :mod:`.driver`, and only this module knows both. The distributed modules
(:mod:`._dist_plan`, :mod:`.distributed`) are imported only when they are needed.
"""

from __future__ import annotations

from typing import Any

from drivetrain.backend import Driver, module_driver_factory

from .driver import TorchSingleDriver


def _distributed(model: Any, device: Any, nproc: int | None, options: dict[str, Any]) -> Driver | None:
    """The DDP driver when the process group is already initialised, under torchrun with ``WORLD_SIZE > 1``,
    for a list of several devices, or for ``nproc > 1``; None for one process on one device."""
    from ._dist_plan import plan_distributed

    plan = plan_distributed(model, device, nproc, options["framework_kwargs"] or {})
    if plan is None:
        return None
    from .distributed import TorchDDPDriver

    return TorchDDPDriver(model, plan, **options)


create_driver = module_driver_factory(TorchSingleDriver, _distributed)
"""Build the torch driver for ``model`` on ``device`` (see :mod:`drivetrain_torch._device` for devices).

``framework_kwargs`` holds torch-only options (:data:`.driver.FRAMEWORK_KWARGS`, plus
:data:`~drivetrain_torch._dist_plan.DIST_KWARGS` when distributed); the Trainer's
``torch_kwargs=`` arrives here under that name.
"""
