"""Weights moving between jittor and the other frameworks through drivetrain: same logits within 1e-4 (fp32).

torch <-> jittor live in this env (it has torch too); paddle and oneflow through the folders they wrote
(``tests/data/cross_framework``, made by ``python -m tests._cross_generate <framework>``); jittor.models'
ResNet-18 against the same ResNet-18 written in torch.
"""

from __future__ import annotations

import numpy as np
import pytest

import drivetrain
from tests._cross_models import (
    TOLERANCE,
    committed_difference,
    live_difference,
    logits,
    max_difference,
    randomize_statistics,
    torch_resnet18,
    trainer_for,
)

pytest.importorskip("torch")
pytest.importorskip("drivetrain_torch")


@pytest.mark.parametrize("source", ["paddle", "oneflow", "torch"])
def test_a_folder_written_in_another_framework_gives_the_same_logits(source):
    difference = committed_difference("jittor", source)
    print(f"{source} -> jittor (committed folder): max abs logit difference {difference:.3g}")
    assert difference <= TOLERANCE


@pytest.mark.parametrize("source, target", [("torch", "jittor"), ("jittor", "torch")])
def test_trained_in_one_loaded_in_the_other(tmp_path, source, target):
    difference = live_difference(source, target, str(tmp_path / "model"))
    print(f"{source} -> {target} (live): max abs logit difference {difference:.3g}")
    assert difference <= TOLERANCE


@pytest.mark.parametrize("direction", ["torch->jittor", "jittor->torch"])
def test_jittor_models_resnet18_and_the_same_resnet18_in_torch(tmp_path, direction):
    import jittor.models

    drivetrain.seed_everything(0)
    zoo, ours = jittor.models.resnet18(), torch_resnet18()
    source, target = (("torch", ours), ("jittor", zoo)) if direction == "torch->jittor" else \
        (("jittor", zoo), ("torch", ours))
    randomize_statistics(source[0], source[1], seed=1)
    folder = str(tmp_path / "resnet18")
    trainer_for(*source).save_model(folder)
    trainer_for(*target).load_model(folder)
    x = np.random.default_rng(2).standard_normal((2, 3, 64, 64)).astype(np.float32)
    difference = max_difference(logits(target[0], target[1], x), logits(source[0], source[1], x))
    print(f"ResNet-18 {direction}: max abs logit difference {difference:.3g}")
    assert difference <= TOLERANCE
