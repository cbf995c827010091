"""State without pickle: tensor files, optimizer and gradient state, jittor's RNG, exact resume mid-epoch."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest

from drivetrain import CheckpointCallback, DriverError, Event, Trainer, seed_everything

from .conftest import Points, TinyNet, jt

pytestmark = pytest.mark.jittor


def weights(model) -> dict[str, np.ndarray]:
    return {k: v.numpy().copy() for k, v in model.state_dict().items()}


def test_tensor_files_round_trip_every_dtype_exactly(make_driver, model, tmp_path):
    driver = make_driver(model)
    rng = np.random.default_rng(0)
    arrays = {"f32": rng.standard_normal((3, 2)).astype(np.float32), "f64": rng.standard_normal(4),
              "f16": rng.standard_normal(5).astype(np.float16), "i64": np.array([2**40, -3], np.int64),
              "i32": np.array([7, -7], np.int32), "u8": np.array([0, 255], np.uint8),
              "flag": np.array([True, False])}
    tensors = {k: jt.array(v, dtype=str(v.dtype)) for k, v in arrays.items()}
    tensors["bf16"] = jt.array(np.array([1.5, -2.25, 3.0e10], np.float32)).bfloat16()
    path = str(tmp_path / "t.safetensors")
    driver.save_tensors(tensors, path)
    with open(path, "rb") as f:
        assert not f.read(64).startswith(b"\x80"), "a pickle, not a safetensors file"
    back = driver.load_tensors(path)
    for name, array in arrays.items():
        assert str(back[name].dtype) == str(tensors[name].dtype), name
        np.testing.assert_array_equal(back[name].numpy(), array, err_msg=name)
    assert str(back["bf16"].dtype) == "bfloat16"
    np.testing.assert_array_equal(back["bf16"].float32().numpy(), tensors["bf16"].float32().numpy())
    with pytest.raises(DriverError, match="'bad' is a str"):
        driver.save_tensors({"bad": "text"}, path)


def test_load_model_state_is_strict_about_shapes(make_driver):
    driver = make_driver(TinyNet())
    state = {k: v.numpy() for k, v in TinyNet(n_hidden=5).state_dict().items()}
    with pytest.raises(DriverError, match=r"state\['fc1.weight'\] has shape \[5, 4\].*\[8, 4\]"):
        driver.load_model_state(state)


def snapshot(state):
    """A copy of a nested state with every Var as a numpy array (states hold the live Vars)."""
    if isinstance(state, jt.Var):
        return state.numpy().copy()
    if isinstance(state, dict):
        return {k: snapshot(v) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(snapshot(v) for v in state)
    return state


def _adam_trainer(batches, **options):
    model = TinyNet()
    return model, Trainer(model, batches, jt.optim.Adam(model.parameters(), lr=0.01), driver="jittor", device="cpu",
                          progress_bar=None, **options)


def test_optimizer_and_gradient_state_continue_an_accumulation_cycle(batches):
    model, trainer = _adam_trainer(batches[:3], n_epochs=1)
    driver = trainer.driver
    fn, sig = driver.get_model_call_fn(None)
    for batch in batches[:2]:  # two full steps
        driver.backward(driver.model_call(batch, fn, sig)["loss"])
        driver.step()
        driver.zero_grad()
    driver.backward(driver.model_call(batches[2], fn, sig)["loss"] / 2)  # half a cycle
    saved = snapshot((driver.model_state(), driver.optimizer_states(), driver.gradient_state()))  # live Vars: copy
    assert set(saved[2]) == {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}
    assert saved[1][0]["attributes"]["n_step"] == 3 and set(saved[1][0]["groups"][0]["slots"]) == {"values", "m"}
    driver.backward(driver.model_call(batches[3], fn, sig)["loss"] / 2)
    driver.step()
    want = weights(model)

    other, again = _adam_trainer(batches[:3], n_epochs=1)
    copy = again.driver
    copy.load_model_state(saved[0])
    copy.load_optimizer_states(saved[1])
    copy.load_gradient_state(saved[2])
    copy.backward(copy.model_call(batches[3], *copy.get_model_call_fn(None))["loss"] / 2)
    copy.step()
    for name, value in weights(other).items():
        np.testing.assert_array_equal(value, want[name], err_msg=name)
    assert copy.gradient_state() == {}, "step() must leave no live gradients"
    with pytest.raises(DriverError, match="was saved from a Adam but this optimizer is a SGD"):
        copy.optimizers = [jt.optim.SGD(other.parameters(), lr=0.1)]
        copy.load_optimizer_states(saved[1])


def test_rng_state_continues_dropout_exactly(make_driver, model):
    driver = make_driver(model)
    driver.seed(5)
    jt.random((7,)).numpy()
    state = driver.rng_state()
    first = jt.nn.dropout(jt.ones((50,)), 0.5, is_train=True).numpy()
    jt.random((3,)).numpy()
    driver.load_rng_state(state)
    np.testing.assert_array_equal(jt.nn.dropout(jt.ones((50,)), 0.5, is_train=True).numpy(), first)
    with pytest.raises(DriverError, match="'seed' and 'engine'"):
        driver.load_rng_state({"cpu": 1})
    with pytest.raises(DriverError, match="not a state of jittor's engine"):
        driver.load_rng_state({"seed": 1, "engine": 0})


class DropNet(TinyNet):
    def execute(self, x, target=None):
        hidden = jt.nn.dropout(jt.nn.relu(self.fc1(x)), 0.3, is_train=self.is_training())
        pred = self.fc2(hidden)
        return {"pred": pred, "loss": jt.nn.cross_entropy_loss(pred, target)}


def _resumable(callbacks=None):
    seed_everything(0)
    model = DropNet()
    trainer = Trainer(model, Points(100, batch_size=8, shuffle=True), jt.optim.Adam(model.parameters(), lr=0.01),
                      driver="jittor", device="cpu", n_epochs=2, accumulation_steps=3, progress_bar=None,
                      callbacks=callbacks)
    return model, trainer


def test_a_run_stopped_mid_epoch_and_mid_cycle_resumes_bit_identically(tmp_path):
    model, reference = _resumable()
    reference.run(num_eval_sanity_batch=0)
    want = weights(model)
    ckpt = str(tmp_path / "ckpt")
    _, first = _resumable([CheckpointCallback(ckpt, every_n_batches=4, save_last=False)])

    def stop(t):
        if t.global_forward_batches == 18:  # epoch 1, batch 5: after the checkpoint at 16, inside a cycle
            raise RuntimeError("stopped on purpose")

    first.add_callback_fn(Event.on_train_batch_end(), stop)
    with pytest.raises(Exception, match="stopped on purpose"):
        first.run(num_eval_sanity_batch=0, catch_KeyboardInterrupt=False)
    names = []
    for _folder, _, files in os.walk(ckpt):
        names += files
    assert names and not any(n.endswith((".pkl", ".pt", ".bin")) for n in names), names
    resumed_model, resumed = _resumable([CheckpointCallback(ckpt, every_n_batches=4, save_last=False)])
    resumed.run(num_eval_sanity_batch=0, resume_from=ckpt)
    assert resumed.global_forward_batches == reference.global_forward_batches == 26
    for name, value in weights(resumed_model).items():
        np.testing.assert_array_equal(value, want[name], err_msg=name)


def test_checkpoints_load_without_unpickling(tmp_path, monkeypatch, batches):
    model, trainer = _adam_trainer(batches, n_epochs=1)
    trainer.run(num_eval_sanity_batch=0)
    trainer.save_checkpoint(str(tmp_path / "c"))

    def refuse(*args, **kwargs):
        raise AssertionError("pickle was used to load a checkpoint")

    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    other, again = _adam_trainer(batches, n_epochs=1)
    again.load_checkpoint(str(tmp_path / "c"))
    for name, value in weights(other).items():
        np.testing.assert_array_equal(value, weights(model)[name], err_msg=name)
