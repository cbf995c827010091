"""Which process layout a jax Trainer asks for (placeholder until the data-parallel driver lands)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from drivetrain.backend import DriverError, check_layout_arguments

DIST_KWARGS: dict[str, str] = {}


def plan_distributed(model: Any, device: Any, nproc: Any, options: Mapping[str, Any]) -> None:
    check_layout_arguments(nproc, device)
    if (nproc or 1) > 1 or (isinstance(device, (list, tuple)) and len(device) > 1):
        raise DriverError("the jax driver runs one process for now.")
    return None
