"""jittor.models' ResNet-18, a model nobody here wrote, end to end through the public API.

The code under test is examples/ecosystems/jittor_models.py, the script that
docs/ecosystems/jittor-models.md shows verbatim: a ``jittor.dataset.Dataset``
subclass yielding ``(image, label)`` tuples, an ``input_mapping`` function naming
them ``x`` (for ``execute(self, x)``) and ``label``, the loss from ``loss_fn``
because the model returns bare logits, ``Accuracy`` reading those logits as
``pred`` and ``label`` as ``target``.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import numpy as np
import pytest

from drivetrain import Trainer

from ...docs.test_examples import code_blocks
from ..conftest import jt

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "ecosystems" / "jittor_models.py"
PAGE = ROOT / "docs" / "ecosystems" / "jittor-models.md"

pytestmark = [pytest.mark.jittor, pytest.mark.slow]


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("jittor_models_example", EXAMPLE)
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
    return {name: np.array(value.numpy()) for name, value in model.state_dict().items()}


def test_the_zoo_resnet_trains_above_chance_and_evaluates_with_accuracy(trained) -> None:
    assert isinstance(trained.model, jt.models.resnet.ResNet)
    assert trained.global_forward_batches == 16  # 2 epochs of 128 samples in batches of 16
    accuracy = trained.evaluate()["acc#acc#dev"]
    print(f"jittor.models resnet18: dev accuracy {accuracy:.3f} after 2 epochs (chance 0.1)")
    assert accuracy >= 0.4


def test_predictions_are_in_dataset_order_and_a_reloaded_model_gives_the_same(example, trained, loaders,
                                                                               tmp_path) -> None:
    _, dev = loaders
    predictions, reloaded, reloaded_accuracy = example.predict_and_reload(trained, dev, tmp_path / "model")
    assert set(predictions) == {"pred"}  # the bare logits, named "pred"
    assert isinstance(predictions["pred"], np.ndarray) and predictions["pred"].shape == (len(dev.labels), 10)
    model = trained.model
    model.eval()
    with jt.no_grad():  # the model called by hand, on the whole dev set at once
        logits = model(jt.array(dev.images)).numpy()
    model.train()
    np.testing.assert_allclose(predictions["pred"], logits, rtol=1e-4, atol=1e-4)
    accuracy = trained.evaluate()["acc#acc#dev"]
    assert float((predictions["pred"].argmax(-1) == dev.labels).mean()) == pytest.approx(accuracy)
    # save_model -> a fresh ResNet-18 -> load_model: identical predictions and accuracy
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
