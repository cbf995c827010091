"""The torch backend's kit for drivetrain's conformance checks (``drivetrain.testing``)."""

from __future__ import annotations

import dataclasses

import torch

from drivetrain.testing import BackendKit, torch_style_kit


def torch_kit() -> BackendKit:
    return torch_style_kit("torch", torch, torch.from_numpy, random=lambda: float(torch.rand(())))


def torch_fsdp_kit() -> BackendKit:
    """torch's kit under ``driver="torch_fsdp"`` (one process: a world of one)."""
    kit = torch_style_kit("torch_fsdp", torch, torch.from_numpy, random=lambda: float(torch.rand(())))
    return dataclasses.replace(kit, framework="torch").no_checkpoint_inside_a_cycle(
        "FSDP holds the gradients of an unfinished accumulation cycle unreduced in its shards, so driver='torch_fsdp' "
        "refuses gradient_state() there (a checkpoint taken when a cycle ends resumes bit for bit)")
