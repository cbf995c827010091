"""Weights moving between torch and flax NNX through drivetrain's layout rules: the Conv/BatchNorm/Linear network of
tests/_cross_models.py as an NNX twin (kernels [in, out] and [h, w, in, out], BatchNorm's scale/mean/var, no batch
counter), logits within 1e-4 both ways. The committed torch folder needs no torch; the live runs skip without it."""

from __future__ import annotations

import os

import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import drivetrain
from drivetrain import Trainer
from tests._cross_models import DATA, TOLERANCE, max_difference, probe_input, training_batches


class Net(nnx.Module):
    """The twin of ``tests._cross_models.torch_net``: same attribute names, NCHW input like torch's."""

    def __init__(self) -> None:
        rngs = nnx.Rngs(0)
        self.conv = nnx.Conv(3, 4, kernel_size=(3, 3), padding=1, rngs=rngs)
        self.bn = nnx.BatchNorm(4, momentum=0.9, epsilon=1e-5, rngs=rngs)  # torch's momentum 0.1 in flax's terms
        self.fc1, self.fc2 = nnx.Linear(4, 4, rngs=rngs), nnx.Linear(4, 3, rngs=rngs)

    def __call__(self, x):
        h = nnx.relu(self.bn(self.conv(jnp.transpose(x, (0, 2, 3, 1))))).mean(axis=(1, 2))
        return self.fc2(nnx.relu(self.fc1(h)))

    def train_step(self, x, y):
        return {"loss": optax.softmax_cross_entropy_with_integer_labels(self(x), y).mean()}


def jax_logits(model, x: np.ndarray) -> np.ndarray:
    model.eval()
    return np.asarray(model(jnp.asarray(x)))


def jax_trainer(model) -> Trainer:
    return Trainer(model, training_batches(), nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param), driver="jax",
                   n_epochs=2, progress_bar=None)


def test_the_committed_torch_folder_loads_into_the_nnx_twin():
    probe = np.load(os.path.join(DATA, "torch", "probe.npz"))
    model = drivetrain.load_weights(Net(), os.path.join(DATA, "torch", "model"), driver="jax")
    assert max_difference(jax_logits(model, probe["x"]), probe["logits"]) <= TOLERANCE


def test_trained_in_torch_loaded_in_jax_and_back(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("drivetrain_torch")
    from tests._cross_models import logits, torch_net, train, trainer_for

    drivetrain.seed_everything(0)
    trained = torch_net()
    train("torch", trained).save_model(str(tmp_path / "torch"))
    moved = Net()
    jax_trainer(moved).load_model(str(tmp_path / "torch"))
    x = probe_input()
    assert max_difference(jax_logits(moved, x), logits("torch", trained, x)) <= TOLERANCE

    trainer = jax_trainer(Net())
    trainer.run()
    trainer.save_model(str(tmp_path / "jax"))
    back = torch_net()
    trainer_for("torch", back).load_model(str(tmp_path / "jax"))
    assert max_difference(logits("torch", back, x), jax_logits(trainer.model, x)) <= TOLERANCE
    assert float(back.bn.num_batches_tracked) == 0  # flax counts no batches: the neutral layout's counter is filled
