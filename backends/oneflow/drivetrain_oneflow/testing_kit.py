"""The oneflow backend's kit for drivetrain's conformance checks (``drivetrain.testing``)."""

from __future__ import annotations

import oneflow as flow

from drivetrain.testing import BackendKit, torch_style_kit


def oneflow_kit() -> BackendKit:
    return torch_style_kit("oneflow", flow, flow.tensor, random=lambda: float(flow.rand(()).item()))
