"""The factory the plugin points at: builds the single-process or the distributed torch driver.

It lives apart from both drivers so that neither imports the other: :mod:`.distributed`
builds on :mod:`.driver`, and only this module knows both. The distributed modules
(:mod:`._dist_plan`, :mod:`.distributed`) are imported only when they are needed: the DDP
driver is built when the process group is already initialised, under torchrun with
``WORLD_SIZE > 1``, for a list of several devices, or for ``nproc > 1``. ``driver="torch_fsdp"``
builds the FSDP2 driver (:mod:`.fsdp`) from the same layouts (:mod:`._fsdp_plan`): ``create_fsdp_driver``.
"""

from __future__ import annotations

from drivetrain.backend import module_driver_factory, planned_distributed

from .driver import TorchSingleDriver

create_driver = module_driver_factory(TorchSingleDriver, planned_distributed(
    "drivetrain_torch._dist_plan:plan_distributed", "drivetrain_torch.distributed:TorchDDPDriver"))
"""Build the torch driver for ``model`` on ``device`` (see :mod:`drivetrain_torch._device` for devices).

``framework_kwargs`` holds torch-only options (:data:`.driver.FRAMEWORK_KWARGS`, plus
:data:`~drivetrain_torch._dist_plan.DIST_KWARGS` when distributed); the Trainer's
``torch_kwargs=`` arrives here under that name.
"""

create_fsdp_driver = module_driver_factory(TorchSingleDriver, planned_distributed(
    "drivetrain_torch._fsdp_plan:plan_fsdp", "drivetrain_torch.fsdp:TorchFSDPDriver"))
"""Build the ``torch_fsdp`` driver (its options arrive from ``torch_fsdp_kwargs=``); one process is a world of one."""
