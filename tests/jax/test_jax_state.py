"""Checkpoints and saved models of the jax driver: safetensors only (bfloat16 and PRNG keys included), frozen
parameters left out and fingerprinted (the scenario of tests/_frozen_rule.py), save_model/load_model, and states that
do not fit refused by name."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from drivetrain import Trainer
from drivetrain.backend import DriverError, create_driver
from drivetrain_jax import DataLoader

from .._frozen_rule import BATCH, check_frozen_run, pretrained, samples
from .conftest import MLP, cross_entropy, logits_loss, regression_batches


class Frozen(nnx.Module):
    """A frozen "pretrained" encoder, a batch norm and a trained head; the optimizer's wrt leaves the encoder out."""

    def __init__(self, seed: int = 0) -> None:
        self.encoder = nnx.Linear(8, 16, rngs=nnx.Rngs(0))
        self.encoder.kernel.set_value(jnp.asarray(pretrained(seed, (8, 16))))  # flax keeps a kernel as [in, out]
        self.encoder.bias.set_value(jnp.asarray(pretrained(seed + 10, (16,))))
        self.norm = nnx.BatchNorm(16, rngs=nnx.Rngs(0))
        self.head = nnx.Linear(16, 3, rngs=nnx.Rngs(1))

    def __call__(self, x, y):
        logits = self.head(nnx.relu(self.norm(self.encoder(x))))
        return {"loss": cross_entropy(logits, y), "pred": logits}


TRAINED = nnx.All(nnx.Param, nnx.Not(nnx.PathContains("encoder")))


def frozen_trainer(model, **kwargs) -> Trainer:
    x, y = samples()
    data = [(x[i], y[i].astype(np.int32)) for i in range(len(x))]
    optimizer = nnx.Optimizer(model, optax.adam(0.01), wrt=TRAINED)
    return Trainer(model, DataLoader(data, batch_size=BATCH, shuffle=True), optimizer, driver="jax", n_epochs=2,
                   progress_bar=None, **kwargs)


def weights(model) -> dict[str, np.ndarray]:
    return {".".join(map(str, p)): np.asarray(v.get_raw_value())
            for p, v in nnx.to_flat_state(nnx.state(model, nnx.Not(nnx.RngState)))}


def test_a_frozen_encoder_is_left_out_statistics_kept_and_the_resume_is_exact(tmp_path):
    check_frozen_run(tmp_path, make_model=Frozen, trainer_for=frozen_trainer, weights=weights,
                     kept={"norm.scale", "norm.bias", "norm.mean", "norm.var", "head.kernel", "head.bias"},
                     frozen={"encoder.kernel", "encoder.bias"})


def test_save_model_and_load_model_give_the_same_model(tmp_path):
    model = MLP(16, 32, 4, rngs=nnx.Rngs(0))
    trainer = Trainer(model, regression_batches(4), nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param),
                      driver="jax", n_epochs=2, loss_fn=logits_loss, progress_bar=None)
    trainer.run()
    trainer.save_model(tmp_path / "model")
    manifest = json.loads((tmp_path / "model" / "manifest.json").read_text())
    assert manifest["pickle"] is False and manifest["driver"] == "jax"
    other = MLP(16, 32, 4, rngs=nnx.Rngs(7))
    Trainer(other, regression_batches(1), nnx.Optimizer(other, optax.adam(1e-2), wrt=nnx.Param), driver="jax",
            progress_bar=None).load_model(tmp_path / "model")
    want, got = weights(model), weights(other)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    model.eval(), other.eval()
    x = regression_batches(1)[0]["x"]
    np.testing.assert_array_equal(np.asarray(other(x)), np.asarray(model(x)))


def test_bfloat16_arrays_and_random_state_round_trip_exactly(tmp_path):
    class Half(nnx.Module):
        def __init__(self):
            self.linear = nnx.Linear(4, 3, param_dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
            self.drop = nnx.Dropout(0.5, rngs=nnx.Rngs(dropout=5))

        def __call__(self, x):
            return self.drop(self.linear(x))

    model = Half()
    driver = create_driver("jax", model, "cpu")
    path = str(tmp_path / "half.safetensors")
    driver.save_tensors(driver.model_state(), path)
    loaded = driver.load_tensors(path)
    assert loaded["linear.kernel"].dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(loaded["linear.kernel"]), np.asarray(model.linear.kernel[...]))
    state = driver.rng_state()
    assert state["impl"] == {"drop.rngs.key": "threefry2x32"}
    x = jnp.ones((2, 4), jnp.bfloat16)
    first = np.asarray(model(x))
    driver.load_rng_state(json.loads(json.dumps({k: {n: np.asarray(v).tolist() if k != "impl" else v
                                                     for n, v in entries.items()} for k, entries in state.items()})))
    np.testing.assert_array_equal(np.asarray(model(x)), first)  # the same dropout mask again
    with pytest.raises(DriverError, match="is a PRNG key array; write jax.random.key_data"):
        driver.save_tensors({"key": model.drop.rngs.key[...]}, path)
    assert jax.dtypes.issubdtype(model.drop.rngs.key[...].dtype, jax.dtypes.prng_key)


def test_states_that_do_not_fit_are_refused_by_name(mlp):
    driver = create_driver("jax", mlp, "cpu")
    driver.set_optimizers(nnx.Optimizer(mlp, optax.adam(1e-3), wrt=nnx.Param))
    state = driver.model_state()
    with pytest.raises(DriverError, match=r"missing key\(s\) \['bn.bias'\]"):
        driver.load_model_state({k: v for k, v in state.items() if k != "bn.bias"})
    with pytest.raises(DriverError, match=r"state\['linear2.bias'\] has shape \(5,\) but the model's"):
        driver.load_model_state({**state, "linear2.bias": np.zeros(5, np.float32)})
    adam_state = driver.optimizer_states()
    driver.set_optimizers(nnx.Optimizer(mlp, optax.sgd(1e-3), wrt=nnx.Param))
    with pytest.raises(DriverError, match=r"does not fit this nnx.Optimizer.*the same optax transformation"):
        driver.load_optimizer_states(adam_state)
    with pytest.raises(DriverError, match="random streams are"):
        driver.load_rng_state({"key_data": {}, "impl": {}, "count": {}})
