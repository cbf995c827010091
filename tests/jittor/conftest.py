"""Fixtures for the jittor backend tests: real jittor on CPU, imported the safe way, small models."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import importlib.util  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

if importlib.util.find_spec("jittor") is None or importlib.util.find_spec("drivetrain_jittor") is None:
    pytest.skip("jittor or drivetrain-jittor is not installed", allow_module_level=True)
from drivetrain_jittor import import_jittor  # noqa: E402  (sets jittor's import environment first)

jt = import_jittor()

from drivetrain.backend._plugins import create_driver  # noqa: E402


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "jittor: needs the jittor backend")


def pytest_collection_modifyitems(config, items) -> None:
    """Tests marked ``gpu`` are skipped where jittor has no CUDA."""
    if jt.has_cuda:
        return
    skip = pytest.mark.skip(reason="needs CUDA in jittor (jt.has_cuda is False)")
    here = os.path.dirname(os.path.abspath(__file__))
    for item in items:
        if item.get_closest_marker("gpu") is not None and str(item.path).startswith(here):
            item.add_marker(skip)


class TinyNet(jt.Module):
    """A two-layer MLP whose execute takes ``x`` and ``target`` and returns ``pred`` and the loss in a dict."""

    def __init__(self, n_in: int = 4, n_hidden: int = 8, n_out: int = 2, seed: int = 0) -> None:
        super().__init__()
        self.fc1 = jt.nn.Linear(n_in, n_hidden)
        self.fc2 = jt.nn.Linear(n_hidden, n_out)
        rng = np.random.default_rng(seed)
        for layer in (self.fc1, self.fc2):
            layer.weight.update(jt.array(rng.standard_normal(layer.weight.shape).astype(np.float32) * 0.5))
            layer.bias.update(jt.zeros(layer.bias.shape))

    def execute(self, x, target=None):
        pred = self.fc2(jt.nn.relu(self.fc1(x)))
        out = {"pred": pred}
        if target is not None:
            out["loss"] = jt.nn.cross_entropy_loss(pred, target)
        return out


def separable(n: int = 128, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A linearly separable two-class problem the TinyNet learns in a few steps."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 4)).astype(np.float32)
    return x, (x[:, 0] + x[:, 1] > 0).astype(np.int32)


class Points(jt.dataset.Dataset):
    """A map-style jittor Dataset of the separable points, one dict per sample."""

    def __init__(self, n: int = 128, seed: int = 0, **attrs) -> None:
        super().__init__()
        self.x, self.y = separable(n, seed)
        self.set_attrs(total_len=n, **attrs)

    def __getitem__(self, i):
        return {"x": self.x[i], "target": self.y[i], "index": i}


@pytest.fixture
def model() -> TinyNet:
    return TinyNet()


@pytest.fixture
def make_driver():
    """``make_driver(model, device="cpu", **options)`` through the public discovery path."""

    def make(model, device="cpu", driver="jittor", **options):
        return create_driver(driver, model, device, **options)

    return make


@pytest.fixture
def batches() -> list[dict]:
    x, y = separable()
    return [{"x": jt.array(x[i:i + 16]), "target": jt.array(y[i:i + 16])} for i in range(0, 128, 16)]
