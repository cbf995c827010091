"""drivetrain computes what the usual torch loop computes, bit for bit, on a network with BatchNorm.

Same seed, same batches, a few dozen steps, with and without accumulation: every parameter and running
statistic must come out equal, not close (the network and the loop: tests/_usual_loop.py).
"""

from __future__ import annotations

import pytest

from .._usual_loop import CASES, torch_style_check

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch


@pytest.mark.parametrize("optimizer, accumulation", CASES)
def test_the_trainer_ends_bit_identical_to_the_usual_torch_loop(optimizer, accumulation) -> None:
    torch_style_check(torch, "torch", optimizer, accumulation)
