"""Fixtures for the torch backend tests: real torch on CPU, one thread, small models."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402

torch = pytest.importorskip("torch")
torch.set_num_threads(1)

from drivetrain.backend._plugins import create_driver  # noqa: E402


def pytest_collection_modifyitems(config, items) -> None:
    """Tests marked ``gpu`` are skipped where torch sees no CUDA device."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (torch.cuda.is_available() is False)")
    here = os.path.dirname(os.path.abspath(__file__))
    for item in items:
        if item.get_closest_marker("gpu") is not None and str(item.path).startswith(here):
            item.add_marker(skip)


class TinyNet(torch.nn.Module):
    """A two-layer MLP whose forward takes ``x`` and ``y`` and returns the loss in a dict."""

    def __init__(self, n_in: int = 4, n_hidden: int = 8, n_out: int = 2) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(n_in, n_hidden)
        self.fc2 = torch.nn.Linear(n_hidden, n_out)
        self.last_hidden_dtype: torch.dtype | None = None

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> dict:
        hidden = torch.relu(self.fc1(x))
        self.last_hidden_dtype = hidden.dtype
        logits = self.fc2(hidden)
        out = {"logits": logits}
        if y is not None:
            out["loss"] = torch.nn.functional.cross_entropy(logits.float(), y)
        return out


@pytest.fixture
def model() -> TinyNet:
    torch.manual_seed(0)
    return TinyNet()


@pytest.fixture
def make_driver():
    """``make_driver(model, device="cpu", **options)`` through the public discovery path."""

    def make(model, device="cpu", driver="torch", **options):
        return create_driver(driver, model, device, **options)

    return make


@pytest.fixture
def batches() -> list[dict]:
    """A linearly separable two-class problem the TinyNet learns in a few steps."""
    gen = torch.Generator().manual_seed(0)
    out = []
    for _ in range(8):
        x = torch.randn(16, 4, generator=gen)
        y = (x[:, 0] + x[:, 1] > 0).long()
        out.append({"x": x, "y": y})
    return out


@pytest.fixture
def tiny_net_cls() -> type:
    return TinyNet
