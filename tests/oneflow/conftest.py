"""Fixtures for the oneflow backend tests: real oneflow 0.9 on CPU (Python 3.10), quiet logs, small models."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("GLOG_minloglevel", "2")  # oneflow's C++ INFO/WARNING lines

import numpy as np  # noqa: E402
import pytest  # noqa: E402

flow = pytest.importorskip("oneflow")
pytest.importorskip("drivetrain_oneflow")

from drivetrain.backend._plugins import create_driver  # noqa: E402


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "oneflow: needs the oneflow backend (Python 3.10)")


def pytest_collection_modifyitems(config, items) -> None:
    """Tests marked ``gpu`` are skipped where oneflow sees no CUDA device."""
    if flow.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (oneflow.cuda.is_available() is False)")
    here = os.path.dirname(os.path.abspath(__file__))
    for item in items:
        if item.get_closest_marker("gpu") is not None and str(item.path).startswith(here):
            item.add_marker(skip)


class TinyNet(flow.nn.Module):
    """A two-layer MLP whose forward takes ``x`` and ``y`` and returns the loss in a dict."""

    def __init__(self, n_in: int = 4, n_hidden: int = 8, n_out: int = 2) -> None:
        super().__init__()
        self.fc1 = flow.nn.Linear(n_in, n_hidden)
        self.fc2 = flow.nn.Linear(n_hidden, n_out)

    def forward(self, x, y=None):
        logits = self.fc2(flow.relu(self.fc1(x)))
        out = {"logits": logits}
        if y is not None:
            out["loss"] = flow.nn.functional.cross_entropy(logits, y)
        return out


def tiny_net(seed: int = 0) -> TinyNet:
    """A TinyNet with weights fixed by ``seed`` (numpy-drawn, so they do not depend on oneflow's generators)."""
    net = TinyNet()
    rng = np.random.default_rng(seed)
    with flow.no_grad():
        for param in net.parameters():
            param.copy_(flow.tensor(rng.standard_normal(tuple(param.shape)).astype(np.float32) * 0.5))
    return net


@pytest.fixture
def model() -> TinyNet:
    return tiny_net()


@pytest.fixture
def make_driver():
    """``make_driver(model, device="cpu", **options)`` through the public discovery path."""

    def make(model, device="cpu", driver="oneflow", **options):
        return create_driver(driver, model, device, **options)

    return make


def make_batches(n: int = 8, size: int = 16, seed: int = 0) -> list[dict]:
    """A linearly separable two-class problem the TinyNet learns in a few steps."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        x = rng.standard_normal((size, 4)).astype(np.float32)
        y = (x[:, 0] + x[:, 1] > 0).astype(np.int64)
        out.append({"x": flow.tensor(x), "y": flow.tensor(y)})
    return out


@pytest.fixture
def batches() -> list[dict]:
    return make_batches()
