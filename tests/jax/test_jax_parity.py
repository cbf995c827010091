"""Same numbers as JAX's usual loop: with fp32 and no accumulation, drivetrain's parameters after N steps are
bit-identical to a hand-written ``nnx.jit`` loop (``nnx.value_and_grad`` + ``optimizer.update``) over the same
batches, for flax's MLP (dropout and batch norm: its random state and statistics follow too) and CNN."""

from __future__ import annotations

import numpy as np
import optax
import pytest
from flax import nnx

from drivetrain import Trainer

from .conftest import CNN, MLP, cross_entropy, digits, logits_loss, regression_batches


def hand_loop(model, optimizer, batches, epochs: int):
    @nnx.jit
    def train_step(model, optimizer, batch):  # flax's MNIST tutorial's step
        def loss_fn(model):
            logits = model(batch["x"])
            return cross_entropy(logits, batch["target"]), logits

        (loss, logits), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
        optimizer.update(model, grads)
        return loss, logits

    model.train()
    for _ in range(epochs):
        for batch in batches:
            train_step(model, optimizer, batch)


def flat(model) -> dict[str, np.ndarray]:
    return {".".join(map(str, path)): np.asarray(v.get_raw_value()) for path, v in
            nnx.to_flat_state(nnx.state(model, nnx.Not(nnx.RngKey)))}


def cnn_batches():
    x, y, _, _ = digits()
    return [{"x": x[i:i + 32], "target": y[i:i + 32]} for i in range(0, 320, 32)]


@pytest.mark.parametrize("build, batches, tx", [
    (lambda: MLP(16, 32, 4, rngs=nnx.Rngs(0)), regression_batches, lambda: optax.adam(1e-2)),
    (lambda: CNN(rngs=nnx.Rngs(0)), cnn_batches, lambda: optax.inject_hyperparams(optax.sgd)(0.1, momentum=0.9)),
], ids=["mlp-adam", "cnn-sgd"])
def test_parameters_are_bit_identical_to_a_hand_nnx_jit_loop(build, batches, tx):
    data = batches()
    reference = build()
    hand_loop(reference, nnx.Optimizer(reference, tx(), wrt=nnx.Param), data, epochs=2)

    model = build()
    trainer = Trainer(model, data, nnx.Optimizer(model, tx(), wrt=nnx.Param), driver="jax", n_epochs=2,
                      loss_fn=logits_loss, progress_bar=None)
    trainer.run()
    want, got = flat(reference), flat(model)
    assert sorted(want) == sorted(got)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    assert trainer.driver.traces == {"train": 1}, trainer.driver.traces  # one program, compiled once
