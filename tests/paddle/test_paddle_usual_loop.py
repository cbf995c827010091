"""drivetrain computes what the usual paddle loop computes, bit for bit, on a network with BatchNorm.

The usual loop: ``loss.backward()`` per batch (``loss / k`` with accumulation), ``optimizer.step()`` then
``optimizer.clear_grad()`` every k batches (tests/_usual_loop.py's ``backward_loop``). Same seed, same
batches, a few dozen steps: every parameter and running statistic (``_mean``, ``_variance``) must come
out equal, not close.
"""

from __future__ import annotations

import numpy as np
import pytest

from .._usual_loop import (
    CASES,
    CHANNELS,
    CLASSES,
    WIDTH,
    assert_identical,
    backward_loop,
    image_batches,
    train_with_trainer,
)
from .conftest import paddle

pytestmark = [pytest.mark.paddle, pytest.mark.filterwarnings("ignore:When training, we now always track global mean")]
nn = paddle.nn


class ConvBNNet(nn.Layer):
    """Two conv + BatchNorm blocks (the second residual) and a Linear on the pooled features."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2D(CHANNELS, WIDTH, 3, padding=1), nn.BatchNorm2D(WIDTH)
        self.conv2, self.bn2 = nn.Conv2D(WIDTH, WIDTH, 3, padding=1), nn.BatchNorm2D(WIDTH)
        self.fc = nn.Linear(WIDTH, CLASSES)

    def forward(self, x, label):
        h = nn.functional.relu(self.bn1(self.conv1(x)))
        h = nn.functional.relu(self.bn2(self.conv2(h)) + h)
        pred = self.fc(h.mean(axis=(2, 3)))
        return {"pred": pred, "loss": nn.functional.cross_entropy(pred, label)}


def _build(optimizer: str):
    paddle.seed(0)  # the initial weights
    model = ConvBNNet()
    if optimizer == "sgd":
        return model, paddle.optimizer.Momentum(learning_rate=0.1, momentum=0.9, parameters=model.parameters())
    return model, paddle.optimizer.Adam(learning_rate=0.01, parameters=model.parameters())


def _state(model) -> dict[str, np.ndarray]:
    return {name: value.numpy().copy() for name, value in model.state_dict().items()}


@pytest.mark.parametrize("optimizer, accumulation", CASES)
def test_the_trainer_ends_bit_identical_to_the_usual_paddle_loop(optimizer, accumulation) -> None:
    batches = [{name: paddle.to_tensor(value) for name, value in batch.items()} for batch in image_batches()]
    model, opt = _build(optimizer)
    backward_loop(model, batches, accumulation, opt.step, opt.clear_grad)  # what a paddle user writes
    want = _state(model)
    model, opt = _build(optimizer)
    initial = _state(model)
    train_with_trainer(model, batches, opt, "paddle", accumulation)
    assert_identical(_state(model), want, initial)
