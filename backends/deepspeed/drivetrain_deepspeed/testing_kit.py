"""The DeepSpeed engine's kit for drivetrain's conformance checks (``drivetrain backends --check deepspeed``)."""

from __future__ import annotations

from typing import Any

import torch

from drivetrain.testing import BackendKit, torch_style_kit

INSIDE_A_CYCLE = ("ZeRO keeps the gradients of an unfinished accumulation cycle in its own partly reduced buffers, "
                  "so driver='deepspeed' refuses gradient_state() there (a checkpoint must be taken when a cycle ends, "
                  "which it resumes bit for bit)")


def deepspeed_kit() -> BackendKit:
    """torch's kit under ``driver="deepspeed"``, less the two checks that checkpoint inside an accumulation cycle."""
    kit = torch_style_kit("deepspeed", torch, torch.from_numpy, random=lambda: float(torch.rand(())))
    kit.train_batch_options = _fixed_micro_batch
    return kit.no_checkpoint_inside_a_cycle(INSIDE_A_CYCLE)


def _fixed_micro_batch(batch_size: int) -> dict[str, Any]:
    """A config that fixes the micro-batch to the train dataloader's, as users write it."""
    return {"deepspeed_kwargs": {"config": {"train_micro_batch_size_per_gpu": batch_size}}}
