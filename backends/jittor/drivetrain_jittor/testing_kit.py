"""The jittor backend's kit for drivetrain's conformance checks (``drivetrain.testing``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from drivetrain.testing import CLASSES, IN_FEATURES, BackendKit

from ._import import import_jittor

jt = import_jittor()


class Classifier(jt.Module):
    """One linear layer with fixed initial weights, returning the loss and the logits."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = jt.nn.Linear(IN_FEATURES, CLASSES)
        weight = np.random.default_rng(0).standard_normal((CLASSES, IN_FEATURES)).astype(np.float32) * 0.3
        self.linear.weight.update(jt.array(weight))
        self.linear.bias.update(jt.zeros(CLASSES))

    def execute(self, x: Any, target: Any) -> dict[str, Any]:
        pred = self.linear(x)
        return {"loss": jt.nn.cross_entropy_loss(pred, target), "pred": pred}


def _to_var(array: np.ndarray) -> Any:
    return jt.array(array, dtype=str(array.dtype))  # jt.array alone turns int64 into int32


def jittor_kit() -> BackendKit:
    return BackendKit(
        driver="jittor",
        make_model=Classifier,
        make_optimizer=lambda model, lr: jt.optim.SGD(model.parameters(), lr=lr),
        to_tensor=_to_var,
        random=lambda: float(jt.random((1,)).numpy()[0]),
    )
