"""Fixtures for the JAX backend tests: real jax/flax on CPU, small models built as flax's own docs build them."""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # no GPU plugin probing on a machine with a CUDA toolkit
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

jax = pytest.importorskip("jax")
pytest.importorskip("flax")
pytest.importorskip("optax")
pytest.importorskip("drivetrain_jax")

import optax  # noqa: E402
from flax import nnx  # noqa: E402


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "jax: needs the jax backend")


class MLP(nnx.Module):
    """The MLP of flax's "NNX basics" page: Linear, BatchNorm, Dropout, gelu, Linear."""

    def __init__(self, din: int, dmid: int, dout: int, *, rngs: nnx.Rngs) -> None:
        self.linear1 = nnx.Linear(din, dmid, rngs=rngs)
        self.dropout = nnx.Dropout(rate=0.1, rngs=rngs)
        self.bn = nnx.BatchNorm(dmid, rngs=rngs)
        self.linear2 = nnx.Linear(dmid, dout, rngs=rngs)

    def __call__(self, x):
        x = nnx.gelu(self.dropout(self.bn(self.linear1(x))))
        return self.linear2(x)


class CNN(nnx.Module):
    """The CNN of flax's MNIST tutorial, sized for 8x8 digits: two Conv + avg_pool, two Linear."""

    def __init__(self, *, rngs: nnx.Rngs) -> None:
        self.conv1 = nnx.Conv(1, 16, kernel_size=(3, 3), rngs=rngs)
        self.conv2 = nnx.Conv(16, 32, kernel_size=(3, 3), rngs=rngs)
        self.linear1 = nnx.Linear(2 * 2 * 32, 64, rngs=rngs)
        self.linear2 = nnx.Linear(64, 10, rngs=rngs)

    def __call__(self, x):
        x = nnx.avg_pool(nnx.relu(self.conv1(x)), window_shape=(2, 2), strides=(2, 2))
        x = nnx.avg_pool(nnx.relu(self.conv2(x)), window_shape=(2, 2), strides=(2, 2))
        x = x.reshape(x.shape[0], -1)
        return self.linear2(nnx.relu(self.linear1(x)))


def cross_entropy(logits, labels):
    """The loss of flax's tutorials: softmax cross entropy with integer labels, averaged."""
    return optax.softmax_cross_entropy_with_integer_labels(logits=logits, labels=labels).mean()


def logits_loss(outputs, batch):
    """A Trainer loss_fn for a model that returns logits, for batches {'x', 'target'}."""
    return cross_entropy(outputs, batch["target"])


def digits(seed: int = 0):
    """scikit-learn's 8x8 digits (no download): (x_train, y_train, x_dev, y_dev), x as NHWC float32 in [0, 1]."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32).reshape(-1, 8, 8, 1)
    order = np.random.default_rng(seed).permutation(len(x))
    x, y = x[order], y[order].astype(np.int32)
    return x[:1400], y[:1400], x[1400:], y[1400:]


@pytest.fixture
def mlp():
    return MLP(16, 32, 4, rngs=nnx.Rngs(0))


def regression_batches(n: int = 8, batch_size: int = 16, din: int = 16, classes: int = 4, seed: int = 0):
    """``n`` batches of {'x', 'target'} numpy arrays."""
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((batch_size, din)).astype(np.float32),
             "target": rng.integers(0, classes, batch_size).astype(np.int32)} for _ in range(n)]
