"""The torch backend's kit for drivetrain's conformance checks (``drivetrain.testing``)."""

from __future__ import annotations

import torch

from drivetrain.testing import BackendKit, torch_style_kit


def torch_kit() -> BackendKit:
    return torch_style_kit("torch", torch, torch.from_numpy, random=lambda: float(torch.rand(())))
