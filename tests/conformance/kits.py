"""Per-backend kits for the conformance suite: a small classifier, its optimizer and data.

A kit is the only backend-specific part: the suite itself (test_contract.py) talks to
the driver through the contract alone. Later backends add a kit here and must pass
the suite unchanged.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

IN_FEATURES, CLASSES = 4, 3


def classification_arrays(n: int = 60, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    centers = np.random.default_rng(99).standard_normal((CLASSES, IN_FEATURES)) * 3
    rng = np.random.default_rng(seed)
    target = rng.integers(0, CLASSES, n)
    x = (centers[target] + rng.standard_normal((n, IN_FEATURES)) * 0.5).astype(np.float32)
    return x, target.astype(np.int64)


@dataclass
class Kit:
    driver: str
    framework: str
    make_model: Callable[[], Any]
    make_optimizer: Callable[[Any, float], Any]
    to_tensor: Callable[[np.ndarray], Any]

    def batches(self, n: int = 60, batch_size: int = 10, seed: int = 0) -> list[dict[str, Any]]:
        x, y = classification_arrays(n, seed)
        return [{"x": self.to_tensor(x[i:i + batch_size]), "target": self.to_tensor(y[i:i + batch_size])}
                for i in range(0, n, batch_size)]


def numpy_kit() -> Kit:
    from drivetrain_numpy import SGD, LinearModel

    return Kit(
        driver="numpy",
        framework="numpy",
        make_model=lambda: LinearModel(IN_FEATURES, CLASSES, loss="ce"),
        make_optimizer=lambda model, lr: SGD(model.params, model.grads, lr=lr),
        to_tensor=lambda a: a,
    )


def torch_kit() -> Kit:
    import torch

    class Classifier(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.linear = torch.nn.Linear(IN_FEATURES, CLASSES)

        def forward(self, x, target):
            pred = self.linear(x)
            return {"loss": torch.nn.functional.cross_entropy(pred, target), "pred": pred}

    return Kit(
        driver="torch",
        framework="torch",
        make_model=Classifier,
        make_optimizer=lambda model, lr: torch.optim.SGD(model.parameters(), lr=lr),
        to_tensor=torch.from_numpy,
    )


def paddle_kit() -> Kit:
    import os
    import warnings

    os.environ.setdefault("GLOG_minloglevel", "2")
    with warnings.catch_warnings():  # paddle warns at import when ccache is not installed
        warnings.simplefilter("ignore")
        import paddle

    class Classifier(paddle.nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            paddle.seed(0)
            self.linear = paddle.nn.Linear(IN_FEATURES, CLASSES)

        def forward(self, x, target):
            pred = self.linear(x)
            return {"loss": paddle.nn.functional.cross_entropy(pred, target), "pred": pred}

    return Kit(
        driver="paddle",
        framework="paddle",
        make_model=Classifier,
        make_optimizer=lambda model, lr: paddle.optimizer.SGD(learning_rate=lr, parameters=model.parameters()),
        to_tensor=lambda a: paddle.to_tensor(a, place=paddle.CPUPlace()),
    )


KITS: dict[str, Callable[[], Kit]] = {"numpy": numpy_kit, "torch": torch_kit, "paddle": paddle_kit}
NEEDS = {"numpy": "drivetrain_numpy", "torch": "drivetrain_torch", "paddle": "drivetrain_paddle"}


def installed(name: str) -> bool:
    return importlib.util.find_spec(NEEDS[name]) is not None
