"""Training with the jax driver: compilations counted, accumulation, learning-rate schedules through
``optax.inject_hyperparams``, clipping, precision, the step's mapping rules, and the refusals that name the fix."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from drivetrain import (
    Accuracy,
    Callback,
    CallbackError,
    ConfigurationError,
    DriverError,
    Evaluator,
    Trainer,
    WarmupSchedule,
)

from .conftest import MLP, cross_entropy, logits_loss, regression_batches


def params(model) -> dict[str, np.ndarray]:
    return {".".join(map(str, path)): np.asarray(v.get_raw_value())
            for path, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}


def sgd(model, lr: float = 0.1, wrt=nnx.Param):
    return nnx.Optimizer(model, optax.inject_hyperparams(optax.sgd)(learning_rate=lr), wrt=wrt)


def test_one_compilation_per_batch_shape_and_mode(mlp):
    batches = regression_batches(6)
    short = {k: v[:5] for k, v in batches[-1].items()}  # an epoch's last, shorter batch
    trainer = Trainer(mlp, batches + [short], sgd(mlp), driver="jax", n_epochs=3, loss_fn=logits_loss,
                      evaluate_dataloaders={"dev": batches[:3]}, metrics={"acc": Accuracy()}, progress_bar=None)
    trainer.run()
    # 21 batches: one program for batches of 16, one more for the batch of 5; evaluation: one forward program
    assert trainer.driver.traces == {"train": 2, "call": 1}, trainer.driver.traces
    trainer.evaluate()
    trainer.predict(batches[:2])
    assert trainer.driver.traces == {"train": 2, "call": 1}


def test_accumulation_adds_a_cycles_gradients_and_equals_the_full_batch():
    batches = regression_batches(4, batch_size=16)
    halves = [{k: v[i:i + 8] for k, v in b.items()} for b in batches for i in (0, 8)]

    def run(data, accumulation):
        model = MLP(16, 32, 4, rngs=nnx.Rngs(0))
        model.dropout.rate = 0.0  # dropout draws differently per batch split: leave it out of this comparison
        model.bn = nnx.LayerNorm(32, rngs=nnx.Rngs(1))  # batch norm's statistics depend on the split too
        trainer = Trainer(model, data, sgd(model), driver="jax", n_epochs=2, loss_fn=logits_loss,
                          accumulation_steps=accumulation, progress_bar=None)
        trainer.run()
        return params(model), trainer.driver.traces

    whole, _ = run(batches, 1)
    accumulated, traces = run(halves, 2)
    for name in whole:
        np.testing.assert_allclose(accumulated[name], whole[name], rtol=2e-5, atol=1e-6, err_msg=name)
    assert traces == {"train": 2, "update": 1}, traces  # a cycle's first batch, its others, one optimizer step


def test_a_warmup_schedule_drives_the_injected_learning_rate(mlp):
    seen = []
    trainer = Trainer(mlp, regression_batches(4), sgd(mlp, lr=0.2), driver="jax", n_epochs=2, loss_fn=logits_loss,
                      callbacks=[WarmupSchedule("linear", warmup_steps=4)], progress_bar=None)
    trainer.add_callback_fn("on_before_optimizers_step", lambda t, opts: seen.append(t.driver.get_lrs()[0][0]))
    trainer.run()
    peak = int(np.argmax(seen))
    assert len(seen) == 8 and seen[peak] == pytest.approx(0.2) and seen[0] < seen[peak] > seen[-1]
    assert seen[:peak + 1] == sorted(seen[:peak + 1]) and seen[peak:] == sorted(seen[peak:], reverse=True)
    assert trainer.driver.traces["train"] == 1  # a new rate is a new value, not a new program


def test_a_schedule_without_inject_hyperparams_names_the_fix(mlp):
    optimizer = nnx.Optimizer(mlp, optax.adam(1e-3), wrt=nnx.Param)
    with pytest.raises(CallbackError, match=r"optax.inject_hyperparams\(optax.adam\)\(learning_rate=1e-3\)"):
        Trainer(mlp, regression_batches(2), optimizer, driver="jax", loss_fn=logits_loss,
                callbacks=[WarmupSchedule(warmup_steps=2)], progress_bar=None)


@pytest.mark.parametrize("clip_type", ["norm", "value"])
def test_clipping_bounds_the_update(clip_type):
    batch = regression_batches(1)

    def one_step(**clip):
        model = MLP(16, 32, 4, rngs=nnx.Rngs(0))
        trainer = Trainer(model, batch, sgd(model, lr=1.0), driver="jax", loss_fn=logits_loss, n_epochs=1,
                          progress_bar=None, **clip)
        before = params(model)
        trainer.run()
        return {k: v - before[k] for k, v in params(model).items()}, trainer.driver

    free, _ = one_step()
    clipped, driver = one_step(grad_clip=1e-3, grad_clip_type=clip_type)
    if clip_type == "norm":
        assert np.sqrt(sum(float(np.sum(d ** 2)) for d in clipped.values())) <= 1e-3 * 1.001
        assert float(driver.grad_norm) == pytest.approx(np.sqrt(sum(float(np.sum(d ** 2)) for d in free.values())),
                                                        rel=1e-4)
    else:
        assert max(float(np.abs(d).max()) for d in clipped.values()) <= 1e-3 * 1.001


class ReadOutputs(Callback):
    """Keeps every training batch's outputs (it reads them only: on the jax driver, after the gradients)."""

    changes_loss = False

    def __init__(self) -> None:
        self.seen: list = []

    def on_before_backward(self, trainer, outputs) -> None:
        self.seen.append(outputs)


def test_bf16_computes_in_bfloat16_and_keeps_float32_parameters():
    class Net(nnx.Module):
        def __init__(self):
            self.body = MLP(16, 32, 4, rngs=nnx.Rngs(0))
            self.head_norm = nnx.LayerNorm(4, dtype=jnp.float32, rngs=nnx.Rngs(0))  # pinned by the user: kept

        def __call__(self, x, target):
            logits = self.head_norm(self.body(x))
            return {"loss": cross_entropy(logits.astype(jnp.float32), target), "dtype": jnp.zeros((), logits.dtype),
                    "hidden": jnp.zeros((), self.body.linear1(x).dtype)}

    model = Net()
    reader = ReadOutputs()
    trainer = Trainer(model, regression_batches(4), sgd(model), driver="jax", precision="bf16", n_epochs=4,
                      callbacks=[reader], progress_bar=None)
    trainer.run()
    seen = reader.seen
    losses = [float(outputs["loss"]) for outputs in seen]
    assert sorted(trainer.driver.bf16_layers) == ["body.bn", "body.linear1", "body.linear2"]
    assert model.head_norm.dtype == jnp.float32 and seen[-1]["dtype"].dtype == jnp.float32
    assert seen[-1]["hidden"].dtype == jnp.bfloat16
    assert {str(v.dtype) for v in params(model).values()} == {"float32"}
    assert np.mean(losses[-4:]) < np.mean(losses[:4])


def test_fp16_is_refused_naming_bf16(mlp):
    with pytest.raises(DriverError, match=r"precision='fp16'.*no loss scaling.*precision='bf16'"):
        Trainer(mlp, regression_batches(2), sgd(mlp), driver="jax", precision="fp16", progress_bar=None)


class Stepped(nnx.Module):
    """A model with train_step / evaluate_step methods taking the batch's keys, like the other backends' models."""

    def __init__(self):
        self.net = MLP(16, 32, 4, rngs=nnx.Rngs(0))

    def train_step(self, x, y):
        return {"loss": cross_entropy(self.net(x), y)}

    def evaluate_step(self, x, y):
        return {"pred": self.net(x), "target": y}

    def __call__(self, x):
        return self.net(x)


def test_train_step_evaluate_step_and_predict_through_the_mapping_rules():
    model = Stepped()
    data = [{"features": b["x"], "label": b["target"]} for b in regression_batches(4)]
    mapping = {"features": "x", "label": "y"}
    trainer = Trainer(model, data, sgd(model), driver="jax", n_epochs=3, input_mapping=mapping,
                      evaluate_dataloaders={"dev": data},
                      metrics={"acc": Accuracy()}, progress_bar=None)
    trainer.run()
    assert 0.0 <= trainer.evaluate()["acc#acc#dev"] <= 1.0
    predicted = trainer.predict([{"x": b["features"]} for b in data], predict_fn="__call__")
    assert predicted["pred"].shape == (64, 4)
    alone = Evaluator(model, data, {"acc": Accuracy()}, driver="jax", input_mapping=mapping, verbose=0).run()
    assert set(alone) == {"acc#acc"}


def test_a_function_that_is_not_the_models_is_refused_for_training(mlp):
    trainer = Trainer(mlp, regression_batches(2), sgd(mlp), driver="jax", progress_bar=None,
                      batch_step_fn=lambda t, batch: None)
    from drivetrain.backend import ArgumentNames, ModelStep

    step = ModelStep(trainer.driver, lambda x, target: {"loss": cross_entropy(mlp(x), target)}, "train_step", None,
                     None, ArgumentNames(), "train function")
    with pytest.raises(DriverError, match="is not a method of the model"):
        trainer.driver.forward_backward(regression_batches(1)[0], step)


def test_refusals_name_the_fix(mlp):
    import flax.linen

    with pytest.raises(DriverError, match=r"flax.linen Module: wrap it with nnx.bridge.ToNNX"):
        Trainer(flax.linen.Dense(3), [1], None, driver="jax", batch_step_fn=lambda t, b: None, progress_bar=None)
    with pytest.raises(DriverError, match=r"not a flax nnx.Optimizer.*nnx.Optimizer\(model, optax.adam"):
        Trainer(mlp, regression_batches(2), optax.adam(1e-3), driver="jax", progress_bar=None)
    with pytest.raises(DriverError, match="optax.multi_transform"):
        Trainer(mlp, regression_batches(2), [sgd(mlp), sgd(mlp)], driver="jax", progress_bar=None)
    with pytest.raises(DriverError, match=r"jax_kwargs has unknown key\(s\) \['donate'\]; accepted: compile_evaluation"):
        Trainer(mlp, regression_batches(2), sgd(mlp), driver="jax", jax_kwargs={"donate": True}, progress_bar=None)
    with pytest.raises(DriverError, match=r"device='cuda:1': jax sees 0 GPU\(s\).*jax\[cuda12\]"):
        Trainer(mlp, regression_batches(2), sgd(mlp), driver="jax", device="cuda:1", progress_bar=None)
    with pytest.raises(ConfigurationError, match="jax driver computes the loss and its gradients in one call"):
        trainer = Trainer(mlp, regression_batches(2), sgd(mlp), driver="jax", progress_bar=None)
        trainer.add_callback_fn("on_before_backward", lambda t, outputs: None)


def test_the_model_is_current_after_each_step_and_auto_finds_the_driver(mlp):
    kernels = []
    trainer = Trainer(mlp, regression_batches(3), sgd(mlp), driver="auto", loss_fn=logits_loss, progress_bar=None)
    trainer.add_callback_fn("on_train_batch_end", lambda t: kernels.append(np.asarray(mlp.linear2.kernel[...])))
    trainer.run()
    assert trainer.driver.name == "jax" and isinstance(mlp.linear2.kernel[...], jax.Array)
    assert all(not np.array_equal(a, b) for a, b in zip(kernels, kernels[1:], strict=False))
    np.testing.assert_array_equal(kernels[-1], np.asarray(mlp.linear2.kernel[...]))
