"""Fixtures for the core's tests: the framework-free numpy driver and small data."""

from __future__ import annotations

import numpy as np
import pytest

drivetrain_numpy = pytest.importorskip("drivetrain_numpy", reason="install the example backend (pip install -e examples/third_party_backend)")


def make_regression(n: int = 64, in_features: int = 3, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, in_features)).astype(np.float32)
    w = np.arange(1, in_features + 1, dtype=np.float32).reshape(in_features, 1)
    return {"x": x, "target": (x @ w + 0.5).astype(np.float32)}


def make_classification(n: int = 90, in_features: int = 4, classes: int = 3, seed: int = 0) -> dict[str, np.ndarray]:
    centers = np.random.default_rng(1234).standard_normal((classes, in_features)) * 3
    rng = np.random.default_rng(seed)
    target = rng.integers(0, classes, n)
    x = (centers[target] + rng.standard_normal((n, in_features)) * 0.5).astype(np.float32)
    return {"x": x, "target": target}


@pytest.fixture
def regression():
    """(model, optimizer, loader) for a 3 -> 1 linear regression."""
    model = drivetrain_numpy.LinearModel(3, 1)
    opt = drivetrain_numpy.SGD(model.params, model.grads, lr=0.05)
    loader = drivetrain_numpy.ArrayLoader(make_regression(), batch_size=8)
    return model, opt, loader


@pytest.fixture
def classification():
    """(model, optimizer, train loader, dev loader) for a 3-class problem."""
    model = drivetrain_numpy.LinearModel(4, 3, loss="ce")
    opt = drivetrain_numpy.SGD(model.params, model.grads, lr=0.5)
    train = drivetrain_numpy.ArrayLoader(make_classification(), batch_size=10, shuffle=True)
    dev = drivetrain_numpy.ArrayLoader(make_classification(seed=1), batch_size=16)
    return model, opt, train, dev
