"""The DeepSpeed engine's kit for drivetrain's conformance checks (``drivetrain backends --check deepspeed``)."""

from __future__ import annotations

import torch

from drivetrain.testing import BackendKit, torch_style_kit


def deepspeed_kit() -> BackendKit:
    return torch_style_kit("deepspeed", torch, torch.from_numpy, random=lambda: float(torch.rand(())))
