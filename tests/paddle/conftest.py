"""Fixtures for the paddle backend tests: real paddle on CPU, quiet logs, small models."""

from __future__ import annotations

import os
import warnings

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("GLOG_minloglevel", "2")  # paddle's C++ INFO lines (executor, PIR passes)
os.environ.setdefault("GLOG_v", "0")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

with warnings.catch_warnings():  # paddle warns at import when no ccache (a compiler cache) is installed
    warnings.simplefilter("ignore")
    paddle = pytest.importorskip("paddle")
pytest.importorskip("drivetrain_paddle")

from drivetrain.backend._plugins import create_driver  # noqa: E402


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "paddle: needs the paddle backend")


def pytest_collection_modifyitems(config, items) -> None:
    """Tests marked ``gpu`` are skipped where paddle sees no CUDA device."""
    if paddle.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device and the paddlepaddle-gpu build")
    here = os.path.dirname(os.path.abspath(__file__))
    for item in items:
        if item.get_closest_marker("gpu") is not None and str(item.path).startswith(here):
            item.add_marker(skip)


class TinyNet(paddle.nn.Layer):
    """A two-layer MLP whose forward takes ``x`` and ``y`` and returns the loss in a dict."""

    def __init__(self, n_in: int = 4, n_hidden: int = 8, n_out: int = 2) -> None:
        super().__init__()
        self.fc1 = paddle.nn.Linear(n_in, n_hidden)
        self.fc2 = paddle.nn.Linear(n_hidden, n_out)

    def forward(self, x, y=None):
        logits = self.fc2(paddle.nn.functional.relu(self.fc1(x)))
        out = {"logits": logits}
        if y is not None:
            out["loss"] = paddle.nn.functional.cross_entropy(logits, y)
        return out


@pytest.fixture
def model() -> TinyNet:
    paddle.seed(0)
    return TinyNet()


@pytest.fixture
def make_driver():
    """``make_driver(model, device="cpu", **options)`` through the public discovery path."""

    def make(model, device="cpu", driver="paddle", **options):
        return create_driver(driver, model, device, **options)

    return make


def separable(n: int = 128, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A linearly separable two-class problem the TinyNet learns in a few steps."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 4)).astype(np.float32)
    return x, (x[:, 0] + x[:, 1] > 0).astype(np.int64)


@pytest.fixture
def batches() -> list[dict]:
    x, y = separable()
    return [{"x": paddle.to_tensor(x[i:i + 16]), "y": paddle.to_tensor(y[i:i + 16])} for i in range(0, 128, 16)]


@pytest.fixture
def tiny_net_cls() -> type:
    return TinyNet
