"""drivetrain computes what the usual oneflow loop (written as in torch) computes, bit for bit, on a network
with BatchNorm.

Same seed, same batches, a few dozen steps, with and without accumulation: every parameter and running
statistic must come out equal, not close (the network and the loop: tests/_usual_loop.py).
"""

from __future__ import annotations

import pytest

from .._usual_loop import CASES, torch_style_check

flow = pytest.importorskip("oneflow")
pytestmark = pytest.mark.oneflow


@pytest.mark.parametrize("optimizer, accumulation", CASES)
def test_the_trainer_ends_bit_identical_to_the_usual_oneflow_loop(optimizer, accumulation) -> None:
    torch_style_check(flow, "oneflow", optimizer, accumulation)
