"""A ResNet written the way model zoos write them (oneflow.nn convolutions, batch norm, residual
blocks, bare logits), end to end through the public API.

flowvision 0.2.2, oneflow's zoo, does not import with oneflow 0.9.0 (``oneflow.jit`` has
no ``_script_if_tracing``), so the model comes from the example itself. The code under
test is examples/ecosystems/oneflow_resnet.py, the script that docs/ecosystems/oneflow.md
shows verbatim: a ``oneflow.utils.data.DataLoader`` over a dataset of dict samples named
like ``forward(self, x)``'s parameter (no input mapping), the loss from ``loss_fn``,
``Accuracy`` reading the logits as ``pred`` and ``label`` as ``target``.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import numpy as np
import pytest

from drivetrain import Trainer

from ...docs.test_examples import code_blocks
from ..conftest import flow

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "ecosystems" / "oneflow_resnet.py"
PAGE = ROOT / "docs" / "ecosystems" / "oneflow.md"

pytestmark = [pytest.mark.oneflow, pytest.mark.slow]


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("oneflow_resnet_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def loaders(example):
    return example.make_loaders()


@pytest.fixture(scope="module")
def trained(example, loaders) -> Trainer:
    """Two epochs of the example's training, evaluated on dev after each: the uninterrupted reference run."""
    return example.train(*loaders)


def _weights(model) -> dict[str, np.ndarray]:
    return {name: value.numpy().copy() for name, value in model.state_dict().items()}


def test_the_resnet_trains_above_chance_and_evaluates_with_accuracy(example, trained) -> None:
    assert isinstance(trained.model, example.ResNet)
    assert trained.global_forward_batches == 16  # 2 epochs of 128 samples in batches of 16
    accuracy = trained.evaluate()["acc#acc#dev"]
    print(f"oneflow ResNet: dev accuracy {accuracy:.3f} after 2 epochs (chance 0.1)")
    assert accuracy >= 0.4


def test_predictions_are_in_dataset_order_and_a_reloaded_model_gives_the_same(example, trained, loaders,
                                                                               tmp_path) -> None:
    _, dev_loader = loaders
    predictions, reloaded, reloaded_accuracy = example.predict_and_reload(trained, dev_loader, tmp_path / "model")
    dev = dev_loader.dataset
    assert set(predictions) == {"pred"}  # the bare logits, named "pred"
    assert isinstance(predictions["pred"], np.ndarray) and predictions["pred"].shape == (len(dev), 10)
    model = trained.model
    model.eval()
    with flow.no_grad():  # the model called by hand, on the whole dev set at once
        logits = model(flow.tensor(dev.images)).numpy()
    np.testing.assert_allclose(predictions["pred"], logits, rtol=1e-4, atol=1e-4)
    accuracy = trained.evaluate()["acc#acc#dev"]
    assert float((predictions["pred"].argmax(-1) == dev.labels).mean()) == pytest.approx(accuracy)
    # save_model -> a fresh model -> load_model: identical predictions and accuracy
    assert set(reloaded) == {"pred"}
    np.testing.assert_array_equal(reloaded["pred"], predictions["pred"])
    assert reloaded_accuracy == pytest.approx(accuracy)


def test_an_interrupted_run_resumes_bit_exactly_into_a_fresh_model(example, trained, loaders, tmp_path) -> None:
    train_loader, _ = loaders
    resumed = example.interrupt_and_resume(train_loader, tmp_path / "checkpoints")
    saved = [p.name for p in (tmp_path / "checkpoints").iterdir()]
    assert len(saved) == 2 and any(re.search(r"step_0*10(\D|$)", name) for name in saved), saved  # steps 5 and 10
    assert resumed.global_forward_batches == 16
    assert resumed.model is not trained.model
    expected, got = _weights(trained.model), _weights(resumed.model)
    assert list(got) == list(expected)
    assert any(name.endswith("running_mean") for name in got) and any(name.endswith("running_var") for name in got)
    different = {name: float(np.abs(got[name] - expected[name]).max())
                 for name in expected if not np.array_equal(got[name], expected[name])}
    assert not different, (f"after resuming, {len(different)} of {len(expected)} tensors differ from the "
                           f"uninterrupted run (name: largest difference): {different}")


def test_the_docs_page_shows_the_tested_script_verbatim() -> None:
    blocks = code_blocks(PAGE.read_text(encoding="utf-8"))
    assert EXAMPLE.read_text(encoding="utf-8") in [block.code for block in blocks], (
        f"{PAGE.relative_to(ROOT)} must show {EXAMPLE.relative_to(ROOT)} verbatim in one code block")
