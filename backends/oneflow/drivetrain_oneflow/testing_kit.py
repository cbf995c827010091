"""The oneflow backend's kit for drivetrain's conformance checks (``drivetrain.testing``)."""

from __future__ import annotations

import numpy as np
import oneflow as flow

from drivetrain.testing import CLASSES, IN_FEATURES, BackendKit


class Classifier(flow.nn.Module):
    """One linear layer with fixed initial weights, returning the loss and the logits."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = flow.nn.Linear(IN_FEATURES, CLASSES)
        weight = np.random.default_rng(0).standard_normal((CLASSES, IN_FEATURES)).astype(np.float32) * 0.3
        with flow.no_grad():
            self.linear.weight.copy_(flow.tensor(weight))
            self.linear.bias.zero_()

    def forward(self, x: flow.Tensor, target: flow.Tensor) -> dict[str, flow.Tensor]:
        pred = self.linear(x)
        return {"loss": flow.nn.functional.cross_entropy(pred, target), "pred": pred}


def oneflow_kit() -> BackendKit:
    return BackendKit(
        driver="oneflow",
        make_model=Classifier,
        make_optimizer=lambda model, lr: flow.optim.SGD(model.parameters(), lr=lr),
        to_tensor=lambda array: flow.tensor(array),
        random=lambda: float(flow.rand(()).item()),
    )
