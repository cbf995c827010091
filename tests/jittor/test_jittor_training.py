"""Training through the Trainer on real jittor: the same numbers as a hand-written jittor loop."""

from __future__ import annotations

import numpy as np
import pytest

from drivetrain import Accuracy, Event, LRSchedulerCallback, Trainer
from drivetrain_jittor import ResumableScheduler

from .conftest import TinyNet, jt

pytestmark = pytest.mark.jittor


def weights(model) -> dict[str, np.ndarray]:
    return {k: v.numpy().copy() for k, v in model.state_dict().items()}


def hand_loop(model, batches, lr=0.1, accumulation=1, clip=None):
    """What a jittor user writes: optimizer.backward per batch, step every ``accumulation`` batches."""
    opt = jt.optim.SGD(model.parameters(), lr=lr)
    model.train()
    for i, batch in enumerate(batches):
        loss = model(batch["x"], batch["target"])["loss"]
        opt.backward(loss / accumulation)
        if (i + 1) % accumulation == 0:
            if clip is not None:
                opt.clip_grad_norm(clip)
            opt.step()
    return weights(model)


@pytest.mark.parametrize("accumulation, clip", [(1, None), (2, None), (1, 0.05)])
def test_trainer_matches_a_hand_written_loop(batches, accumulation, clip):
    want = hand_loop(TinyNet(), batches, accumulation=accumulation, clip=clip)
    model = TinyNet()
    trainer = Trainer(model, batches, jt.optim.SGD(model.parameters(), lr=0.1), driver="jittor", device="cpu",
                      n_epochs=1, accumulation_steps=accumulation, grad_clip=clip, progress_bar=None)
    trainer.run(num_eval_sanity_batch=0)
    for name, value in weights(model).items():
        np.testing.assert_array_equal(value, want[name], err_msg=name)
    assert not np.allclose(want["fc1.weight"], weights(TinyNet())["fc1.weight"])


def test_clip_by_value_bounds_every_gradient(model, batches, make_driver):
    driver = make_driver(model, grad_clip=1e-4, grad_clip_type="value")
    driver.set_optimizers(jt.optim.SGD(model.parameters(), lr=1.0))
    driver.setup()
    before = weights(model)
    fn, sig = driver.get_model_call_fn(None)
    driver.backward(driver.model_call(batches[0], fn, sig)["loss"])
    driver.step()
    for name, value in weights(model).items():
        assert np.abs(value - before[name]).max() <= 1e-4 + 1e-6, name  # + float32 rounding of the update


def test_evaluation_between_epochs_then_training_goes_on(batches):
    model = TinyNet()
    trainer = Trainer(model, batches, jt.optim.SGD(model.parameters(), lr=0.5), driver="jittor", device="cpu",
                      n_epochs=3, evaluate_dataloaders={"dev": batches}, metrics={"acc": Accuracy()},
                      progress_bar=None)
    accs: list[float] = []
    trainer.add_callback_fn(Event.on_evaluate_end(), lambda t, r: accs.append(r["acc#acc#dev"]))
    trainer.run(num_eval_sanity_batch=1)
    assert len(accs) == 3 and accs[-1] >= 0.9
    assert all(not p.is_stop_grad() for p in model.parameters()), "eval mode left the parameters frozen"


def test_eval_mode_and_no_grad(make_driver):
    class Drop(jt.Module):
        def __init__(self) -> None:
            super().__init__()
            self.drop = jt.nn.Dropout(0.5)

        def execute(self, x):
            return self.drop(x)

    model = Drop()
    driver = make_driver(model)
    x = jt.array(np.ones((200,), np.float32))
    driver.set_model_mode("train")
    assert (model(x).numpy() == 0).any()
    driver.set_model_mode("eval")
    np.testing.assert_array_equal(model(x).numpy(), np.ones(200))
    with driver.no_grad():
        assert (model(x) * 2).is_stop_grad()
    assert not (model(x) * jt.array(np.ones(200, np.float32))).is_stop_grad()
    with pytest.raises(Exception, match="'train' or 'eval'"):
        driver.set_model_mode("test")


def test_nested_batches_move_and_scalars_convert(model, make_driver):
    driver = make_driver(model)
    var = jt.array(np.ones((2, 4), np.float32))
    batch = {"a": [np.zeros((2, 4), np.float32), (var, "text")], "n": 3, "ids": np.array([1, 2])}
    moved = driver.move_data_to_device(batch)
    assert isinstance(moved["a"][0], jt.Var) and moved["a"][1][0] is var and moved["a"][1][1] == "text"
    assert isinstance(moved["ids"], jt.Var) and moved["n"] == 3
    already = {"x": var}
    assert driver.move_data_to_device(already) is already
    fn, sig = driver.get_model_call_fn(None)
    one = {"x": jt.array(np.ones((1, 4), np.float32)), "target": jt.array(np.array([1], np.int32))}
    out = driver.model_call(one, fn, sig)
    assert driver.tensor_to_numpy(out["loss"]).shape == ()  # jittor's [1] loss is a scalar
    assert driver.tensor_to_numpy(out["pred"]).shape == (1, 2)
    assert driver.tensor_to_numpy(one["target"]).shape == (1,)  # a batch of one label keeps its shape


def test_resumable_lr_scheduler_through_a_checkpoint(batches, tmp_path):
    def build():
        model = TinyNet()
        opt = jt.optim.SGD(model.parameters(), lr=0.4)
        scheduler = ResumableScheduler(jt.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5))
        return model, opt, Trainer(model, batches, opt, driver="jittor", device="cpu", n_epochs=2,
                                   callbacks=[LRSchedulerCallback(scheduler)], progress_bar=None)

    model, opt, trainer = build()
    trainer.run(num_eval_sanity_batch=0)
    want_lr, want = opt.lr, weights(model)
    assert want_lr == pytest.approx(0.4 * 0.5 ** (16 // 3))

    model, opt, trainer = build()
    trainer.add_callback_fn(Event.on_train_epoch_end(), lambda t: t.save_checkpoint(str(tmp_path / "ckpt")))
    trainer.n_epochs = 1
    trainer.run(num_eval_sanity_batch=0)
    model, opt, trainer = build()
    trainer.run(num_eval_sanity_batch=0, resume_from=str(tmp_path / "ckpt"))
    assert opt.lr == pytest.approx(want_lr)
    for name, value in weights(model).items():
        np.testing.assert_array_equal(value, want[name], err_msg=name)
