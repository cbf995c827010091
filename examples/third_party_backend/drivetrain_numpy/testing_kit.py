"""The numpy reference driver's kit for drivetrain's conformance checks (``drivetrain.testing``)."""

from __future__ import annotations

import numpy as np

from drivetrain.testing import CLASSES, IN_FEATURES, BackendKit

from .model import LinearModel
from .optim import SGD


def numpy_kit() -> BackendKit:
    return BackendKit(
        driver="numpy",
        framework="numpy",  # the module the driver needs; defaults to the driver name
        make_model=lambda: LinearModel(IN_FEATURES, CLASSES, loss="ce"),
        make_optimizer=lambda model, lr: SGD(model.params, model.grads, lr=lr),
        to_tensor=lambda array: array,
        random=lambda: float(np.random.random()),
    )
