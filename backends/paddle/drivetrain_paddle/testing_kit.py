"""The paddle backend's kit for drivetrain's conformance checks (``drivetrain.testing``)."""

from __future__ import annotations

import numpy as np
import paddle

from drivetrain.testing import CLASSES, IN_FEATURES, BackendKit


class Classifier(paddle.nn.Layer):
    """One linear layer with fixed initial weights, returning the loss and the logits."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = paddle.nn.Linear(IN_FEATURES, CLASSES)  # paddle's weight is [in, out]
        weight = np.random.default_rng(0).standard_normal((IN_FEATURES, CLASSES)).astype(np.float32) * 0.3
        self.linear.weight.set_value(weight)
        self.linear.bias.set_value(np.zeros(CLASSES, np.float32))

    def forward(self, x: paddle.Tensor, target: paddle.Tensor) -> dict[str, paddle.Tensor]:
        pred = self.linear(x)
        return {"loss": paddle.nn.functional.cross_entropy(pred, target), "pred": pred}


def paddle_kit() -> BackendKit:
    return BackendKit(
        driver="paddle",
        make_model=Classifier,
        make_optimizer=lambda model, lr: paddle.optimizer.SGD(learning_rate=lr, parameters=model.parameters()),
        to_tensor=lambda array: paddle.to_tensor(array, place=paddle.CPUPlace()),
        random=lambda: float(paddle.rand([])),
    )
