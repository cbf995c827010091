"""The factory the plugin points at: builds the single-process or the distributed oneflow driver.

It lives apart from both drivers so that neither imports the other; the distributed
modules are imported only when they are needed.
"""

from __future__ import annotations

from typing import Any

from drivetrain.backend import module_driver_factory, planned_distributed

from .driver import OneflowSingleDriver


def _plan(model: Any, device: Any, nproc: int | None, framework_kwargs: dict[str, Any]) -> Any:
    """The DDP plan under ``oneflow.distributed.launch`` (``WORLD_SIZE > 1``) and in processes the Trainer
    started; ``nproc > 1`` or several devices in a plain ``python train.py`` make this process start and
    supervise the workers (:mod:`._launch`), and it never returns. None for one process on one device."""
    from ._dist_plan import plan_distributed

    plan = plan_distributed(model, device, nproc, framework_kwargs)
    if plan is not None and plan.launch == "spawn":
        from ._launch import supervise

        supervise(plan)  # exits this process with the workers' verdict
    return plan


create_driver = module_driver_factory(
    OneflowSingleDriver, planned_distributed(_plan, "drivetrain_oneflow.distributed:OneflowDDPDriver"))
"""Build the oneflow driver for ``model`` on ``device`` (see :mod:`._device` for devices)."""
