"""The factory the plugin points at: ``driver="deepspeed"`` for ``model`` on ``device``.

The process layout is planned by :func:`._plan.plan_deepspeed` (a launcher's, the Trainer's own
processes, the user's group, or one process: a world of one), and the driver is
:class:`.driver.TorchDeepSpeedDriver`; both are imported only when the driver is built.
"""

from __future__ import annotations

from drivetrain.backend import module_driver_factory, planned_distributed
from drivetrain_torch.extension import TorchSingleDriver

create_driver = module_driver_factory(TorchSingleDriver, planned_distributed(
    "drivetrain_deepspeed._plan:plan_deepspeed", "drivetrain_deepspeed.driver:TorchDeepSpeedDriver"))
"""Build the ``deepspeed`` driver (its options arrive from ``deepspeed_kwargs=``)."""
