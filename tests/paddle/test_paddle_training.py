"""Optimisation through the paddle driver: optimizers, backward/step/zero_grad, precision, clipping,
model calls, batches, LR schedulers and the Trainer end to end."""

from __future__ import annotations

import warnings
from collections import OrderedDict, namedtuple
from dataclasses import dataclass

import numpy as np
import pytest

from drivetrain import Accuracy, Event, LRSchedulerCallback, Trainer, seed_everything
from drivetrain._common.errors import DriverError

from .conftest import TinyNet, paddle, separable


def _train(driver, batches, epochs: int = 5) -> list[float]:
    """A minimal loop using only driver methods, as the Trainer does; returns the loss per step."""
    fn, sig = driver.get_model_call_fn(None)
    losses = []
    driver.set_model_mode("train")
    for _ in range(epochs):
        for batch in batches:
            batch = driver.move_data_to_device(batch)
            with driver.auto_cast():
                out = driver.model_call(batch, fn, sig)
            driver.backward(out["loss"])
            driver.step()
            driver.zero_grad()
            losses.append(float(driver.tensor_to_numpy(out["loss"])))
    return losses


def _sgd(model, lr: float = 0.5):
    return paddle.optimizer.SGD(learning_rate=lr, parameters=model.parameters())


def _params(model) -> list[np.ndarray]:
    return [p.numpy().copy() for p in model.parameters()]


# ----------------------------------------------------------------------------- optimizers
def test_fp32_training_reduces_the_loss(model, make_driver, batches) -> None:
    d = make_driver(model)
    d.setup()
    d.set_optimizers(_sgd(model))
    losses = _train(d, batches)
    assert np.mean(losses[-8:]) < 0.5 * np.mean(losses[:8])


def test_several_optimizers_all_step(model, make_driver, batches) -> None:
    d = make_driver(model)
    d.set_optimizers([paddle.optimizer.SGD(learning_rate=0.1, parameters=model.fc1.parameters()),
                      paddle.optimizer.Adam(learning_rate=0.01, parameters=model.fc2.parameters())])
    before = _params(model)
    _train(d, batches[:1], epochs=1)
    assert all(not np.array_equal(b, a) for b, a in zip(before, _params(model), strict=True))


def test_zero_grad_releases_gradients_or_fills_zeros(model, make_driver, batches) -> None:
    d = make_driver(model)
    d.set_optimizers(_sgd(model))
    d.backward(d.model_call(batches[0], *d.get_model_call_fn(None))["loss"])
    assert all(p.grad is not None for p in model.parameters())
    d.zero_grad()
    assert all(p.grad is None for p in model.parameters())
    d2 = make_driver(model, framework_kwargs={"set_to_zero": True})
    d2.set_optimizers(_sgd(model))
    d2.backward(d2.model_call(batches[0], *d2.get_model_call_fn(None))["loss"])
    d2.zero_grad()
    assert all(p.grad is not None and not p.grad.numpy().any() for p in model.parameters())


class _ForeignOptimizer:
    """Stands in for another framework's optimizer: only its module name matters."""

    __module__ = "torch.optim.adam"


@pytest.mark.parametrize(
    "optimizer, fragment",
    [
        (object(), "is not a paddle.optimizer.Optimizer"),
        (_ForeignOptimizer(), "(a torch object)"),
        (paddle.optimizer.SGD, "is a class, not an optimizer"),
    ],
)
def test_wrong_optimizers_are_rejected(model, make_driver, optimizer, fragment) -> None:
    d = make_driver(model)
    with pytest.raises(DriverError) as info:
        d.set_optimizers(optimizer)
    assert str(info.value).startswith("optimizers=")
    assert fragment in str(info.value)


def test_second_bad_optimizer_is_named_by_index(model, make_driver) -> None:
    d = make_driver(model)
    with pytest.raises(DriverError, match=r"^optimizers\[1\]="):
        d.set_optimizers([_sgd(model), "adam"])


def test_optimizer_of_another_model_is_rejected_through_the_trainer(model, batches) -> None:
    other = TinyNet()
    with pytest.raises(DriverError, match=r"^optimizers=paddle.optimizer.SGD: none of its 4 parameter.*"
                                          r"belong to the model TinyNet"):
        Trainer(model, batches, _sgd(other), driver="paddle")
    extra = paddle.create_parameter([1], "float32")  # the model's parameters plus an extra one: fine
    Trainer(model, batches, paddle.optimizer.SGD(parameters=[*model.parameters(), extra]), driver="paddle",
            progress_bar=None)


# ----------------------------------------------------------------------------------- loss
def test_loss_that_is_not_a_tensor(model, make_driver) -> None:
    d = make_driver(model)
    with pytest.raises(DriverError, match="'loss' is a float .*not a paddle tensor.*item"):
        d.backward(1.5)


def test_loss_without_gradient(model, make_driver, batches) -> None:
    d = make_driver(model)
    with paddle.no_grad():
        out = d.model_call(batches[0], *d.get_model_call_fn(None))
    with pytest.raises(DriverError, match="does not require grad.*no_grad"):
        d.backward(out["loss"])


def test_loss_with_several_elements(model, make_driver, batches) -> None:
    d = make_driver(model)
    logits = d.model_call(batches[0], *d.get_model_call_fn(None))["logits"]
    with pytest.raises(DriverError, match=r"shape \(16, 2\).*loss_fn=lambda outputs, batch: "
                       r"paddle\.nn\.functional\.cross_entropy\(outputs, batch\['label'\]\).*loss.mean\(\)"):
        d.backward(logits)


# ---------------------------------------------------------------------------- clipping
def _grad_norm(params) -> float:
    return float(np.sqrt(sum(float((p.grad.numpy() ** 2).sum()) for p in params if p.grad is not None)))


@pytest.mark.parametrize("clip_type", ["norm", "value"])
def test_grad_clip_applies_over_all_optimizers(model, make_driver, batches, clip_type) -> None:
    d = make_driver(model, grad_clip=0.01, grad_clip_type=clip_type)
    d.set_optimizers([paddle.optimizer.SGD(learning_rate=0.0, parameters=model.fc1.parameters()),
                      paddle.optimizer.SGD(learning_rate=0.0, parameters=model.fc2.parameters())])
    d.backward(d.model_call(batches[0], *d.get_model_call_fn(None))["loss"])
    assert _grad_norm(model.parameters()) > 0.05
    d.step()
    if clip_type == "norm":  # one global norm over both optimizers' parameters
        assert _grad_norm(model.parameters()) == pytest.approx(0.01, rel=1e-3)
    else:
        assert max(float(np.abs(p.grad.numpy()).max()) for p in model.parameters()) <= 0.01 + 1e-7


def test_grad_clip_through_the_trainer_bounds_what_the_step_sees(model, batches) -> None:
    norms = []
    trainer = Trainer(model, batches, _sgd(model, 0.1), driver="paddle", n_epochs=1, grad_clip=0.05,
                      progress_bar=None)
    trainer.add_callback_fn(Event.on_after_optimizers_step(), lambda t, opts: norms.append(_grad_norm(
        t.model.parameters())))
    trainer.run(num_eval_sanity_batch=0)
    assert len(norms) == len(batches) and max(norms) <= 0.05 * 1.001


# ----------------------------------------------------------------------------- precision
@pytest.mark.parametrize("options", [{"fp16": True}, {"precision": "bf16"}])
def test_low_precision_on_cpu_warns_and_trains_in_fp32(model, batches, options) -> None:
    with pytest.warns(UserWarning, match=r"on CPU: paddle has no (float16|bfloat16) kernels.*trains in fp32"):
        trainer = Trainer(model, batches, _sgd(model), driver="paddle", progress_bar=None, n_epochs=1, **options)
    assert trainer.driver.grad_scaler is None
    assert trainer.driver.precision_state() is None
    assert "(runs in fp32 on CPU)" in trainer.driver.describe()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the warning comes once, at construction, not per batch
        trainer.run(num_eval_sanity_batch=0)
    out = trainer.driver.model_call(batches[0], *trainer.driver.get_model_call_fn(None))
    assert out["logits"].dtype == paddle.float32


def test_amp_options_are_checked(model, make_driver) -> None:
    with pytest.raises(DriverError, match=r"amp_level'\]='O3' is not accepted; use 'O1'"):
        make_driver(model, precision="fp16", framework_kwargs={"amp_level": "O3"})
    with pytest.raises(DriverError, match=r"\['amp_level'\] configure mixed precision, but precision='fp32'"):
        make_driver(model, framework_kwargs={"amp_level": "O2"})
    for precision in ("bf16", "fp32"):  # the core's rule for every backend's scaler options
        with pytest.raises(DriverError, match=rf"^paddle_kwargs \['init_loss_scaling'\] only applies to precision='fp16', "
                                              rf"got precision='{precision}'; remove it or use precision='fp16'\.$"):
            make_driver(model, precision=precision, framework_kwargs={"init_loss_scaling": 1024.0})
    with pytest.raises(DriverError, match=r"decr_ratio'\]=2 is not accepted; it must be float in \(0, 1\)"):
        make_driver(model, precision="fp16", framework_kwargs={"decr_ratio": 2})
    with pytest.warns(UserWarning, match="trains in fp32"):  # Wenxin's settings are accepted
        make_driver(model, precision="fp16", framework_kwargs={
            "amp_level": "O2", "init_loss_scaling": 1.0, "incr_ratio": 2.0, "decr_ratio": 0.8,
            "incr_every_n_steps": 1000, "decr_every_n_nan_or_inf": 2})


def test_paddle_kwargs_are_checked(model, batches) -> None:
    with pytest.raises(DriverError, match=r"paddle_kwargs\['pin_memory'\] is not an option of this driver; "
                                          r"accepted: amp_level"):
        Trainer(model, batches, _sgd(model), driver="paddle", paddle_kwargs={"pin_memory": True})
    with pytest.raises(DriverError, match="applies to distributed paddle training"):
        Trainer(model, batches, _sgd(model), driver="paddle", paddle_kwargs={"find_unused_parameters": True})
    with pytest.raises(DriverError, match="to_static is not True"):
        Trainer(model, batches, _sgd(model), driver="paddle", paddle_kwargs={"input_spec": []})
    # options of other frameworks travel in the same script untouched
    Trainer(model, batches, _sgd(model), driver="paddle", torch_kwargs={"anything": 1}, progress_bar=None)


@pytest.mark.gpu
@pytest.mark.parametrize("precision, level", [("fp16", "O1"), ("fp16", "O2"), ("bf16", "O1")])
def test_mixed_precision_on_gpu(tiny_net_cls, batches, precision, level) -> None:
    paddle.seed(0)
    model = tiny_net_cls()
    trainer = Trainer(model, batches, paddle.optimizer.AdamW(learning_rate=1e-2, parameters=model.parameters()),
                      driver="paddle", device="gpu", precision=precision, paddle_kwargs={"amp_level": level},
                      n_epochs=3, progress_bar=None)
    trainer.run(num_eval_sanity_batch=0)
    with trainer.driver.auto_cast():
        out = trainer.driver.model_call(trainer.driver.move_data_to_device(batches[0]),
                                        *trainer.driver.get_model_call_fn(None))
    assert out["logits"].dtype in (paddle.float16, paddle.bfloat16)
    assert (trainer.driver.grad_scaler is not None) == (precision == "fp16")


# ------------------------------------------------------------------------- model calls
def test_model_call_matches_forward_through_call_and_runs_hooks(model, make_driver, batches) -> None:
    seen = []
    model.register_forward_post_hook(lambda layer, inputs, outputs: seen.append(True))
    d = make_driver(model)
    fn, sig = d.get_model_call_fn(None)
    out = d.model_call({**batches[0], "unused": 1}, fn, sig)
    assert set(out) == {"logits", "loss"} and seen == [True]


def test_train_step_and_named_functions(make_driver, batches) -> None:
    class WithSteps(TinyNet):
        def train_step(self, x, y):
            return {"loss": self(x, y)["loss"] * 0}

        def predict(self, x):
            return {"pred": self(x)["logits"]}

    model = WithSteps()
    d = make_driver(model)
    fn, _ = d.get_model_call_fn(None)
    assert fn == model.train_step
    fn, _ = d.get_model_call_fn("predict", default="evaluate_step")
    assert set(d.model_call(batches[0], fn, fn)) == {"pred"}
    with pytest.raises(DriverError, match="has no method 'nope'"):
        d.get_model_call_fn("nope")


def test_train_and_eval_modes_and_no_grad(make_driver) -> None:
    model = paddle.nn.Sequential(paddle.nn.Linear(4, 4), paddle.nn.Dropout(0.5))
    d = make_driver(model)
    d.set_model_mode("eval")
    assert not model.training and not model[1].training
    d.set_model_mode("train")
    assert model.training and model[1].training
    with pytest.raises(DriverError, match="accepts 'train' or 'eval'"):
        d.set_model_mode("test")
    with d.no_grad():
        assert model(paddle.ones([2, 4])).stop_gradient


# ------------------------------------------------------------------------------ batches
Pair = namedtuple("Pair", "a b")


@dataclass(frozen=True)
class Sample:
    tokens: object
    text: str


def test_move_data_converts_numpy_and_keeps_nested_structure(model, make_driver) -> None:
    d = make_driver(model)
    tensor = paddle.ones([2])
    batch = OrderedDict(
        x=np.ones((2, 4), np.float32), ids=np.arange(3), sample=Sample(np.zeros(2, np.float32), "a b"),
        pair=Pair(tensor, [np.ones(1, np.int64), "id-7", 3]), strings=np.array(["a", "b"]), scalar=np.float32(2))
    moved = d.move_data_to_device(batch)
    assert type(moved) is OrderedDict and moved is not batch
    assert isinstance(moved["x"], paddle.Tensor) and moved["x"].dtype == paddle.float32
    assert moved["ids"].dtype == paddle.int64 and moved["ids"].place.is_cpu_place()
    assert isinstance(moved["sample"], Sample) and isinstance(moved["sample"].tokens, paddle.Tensor)
    assert moved["sample"].text == "a b"
    assert type(moved["pair"]) is Pair and moved["pair"].a is tensor
    assert isinstance(moved["pair"].b[0], paddle.Tensor) and moved["pair"].b[1:] == ["id-7", 3]
    assert moved["strings"] is batch["strings"]  # not numeric: passed through
    assert moved["scalar"] is batch["scalar"]
    assert isinstance(batch["x"], np.ndarray)  # the user's batch is not modified


def test_a_batch_already_in_place_comes_back_as_is(model, make_driver, batches) -> None:
    d = make_driver(model)
    assert d.move_data_to_device(batches[0]) is batches[0]
    nested = {"a": [batches[0]["x"], ("label", batches[0]["y"])], "n": 3}
    assert d.move_data_to_device(nested) is nested


def test_tensor_to_numpy_copies_and_widens_low_precision(model, make_driver) -> None:
    d = make_driver(model)
    t = paddle.to_tensor([1.5, 2.0])
    array = d.tensor_to_numpy(t)
    array[0] = 9
    assert float(t[0]) == 1.5
    bf16 = d.tensor_to_numpy(paddle.to_tensor([1.5, -2.25]).astype("bfloat16"))
    assert bf16.dtype == np.float32 and bf16.tolist() == [1.5, -2.25]
    assert d.tensor_to_numpy(3) == np.asarray(3)
    assert d.is_tensor(t) and not d.is_tensor(array)


# --------------------------------------------------------------------------- end to end
def test_plain_iterable_of_numpy_batches_trains_and_evaluates(model) -> None:
    x, y = separable(256)
    train = [{"x": x[i:i + 32], "y": y[i:i + 32]} for i in range(0, 192, 32)]
    dev = [{"x": x[i:i + 32], "y": y[i:i + 32], "target": y[i:i + 32]} for i in range(192, 256, 32)]
    trainer = Trainer(model, train, _sgd(model, 0.5), driver="paddle", n_epochs=8, evaluate_dataloaders=dev,
                      metrics={"acc": Accuracy()}, output_mapping={"logits": "pred"}, progress_bar=None)
    trainer.run(num_eval_sanity_batch=1)
    assert trainer.evaluate()["acc#acc"] >= 0.9


class Points(paddle.io.Dataset):
    def __init__(self, n: int = 96) -> None:
        self.x, self.y = separable(n)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict:
        return {"x": self.x[i], "y": self.y[i]}


def test_paddle_dataloader_trains(model) -> None:
    loader = paddle.io.DataLoader(Points(), batch_size=16, shuffle=True)
    trainer = Trainer(model, loader, paddle.optimizer.Adam(learning_rate=0.05, parameters=model.parameters()),
                      driver="paddle", n_epochs=4, progress_bar=None)
    trainer.run()
    x, y = separable(64, seed=5)
    model.eval()
    pred = model(paddle.to_tensor(x))["logits"].numpy().argmax(-1)
    assert (pred == y).mean() >= 0.9


def test_lr_scheduler_is_stepped_by_the_callback_and_resumes(model, tmp_path) -> None:
    """paddle's optimizer reads the scheduler; the LRSchedulerCallback steps it (per optimizer step)."""
    loader = paddle.io.DataLoader(Points(64), batch_size=8, shuffle=True)

    def build():
        seed_everything(0)  # numpy's global generator decides the shuffling seed, as in paddle
        net = TinyNet()
        scheduler = paddle.optimizer.lr.StepDecay(learning_rate=0.1, step_size=3, gamma=0.5)
        opt = paddle.optimizer.Momentum(learning_rate=scheduler, momentum=0.9, parameters=net.parameters())
        lrs = []
        trainer = Trainer(net, loader, opt, driver="paddle", n_epochs=2, accumulation_steps=2, progress_bar=None,
                          callbacks=[LRSchedulerCallback(scheduler)])
        trainer.add_callback_fn(Event.on_before_optimizers_step(), lambda t, opts: lrs.append(opts[0].get_lr()))
        return trainer, net, lrs

    trainer, net, lrs = build()
    trainer.run(num_eval_sanity_batch=0)
    assert lrs == pytest.approx([0.1] * 3 + [0.05] * 3 + [0.025] * 2)  # 16 batches / 2 = 8 optimizer steps
    reference = _params(net)

    trainer, net, _ = build()
    trainer.add_callback_fn(Event.on_train_batch_end(), lambda t: t.save_checkpoint(tmp_path / "ck")
                            if t.global_forward_batches == 7 else None)  # mid accumulation cycle
    trainer.run(num_eval_sanity_batch=0)
    trainer, net, lrs = build()
    trainer.run(resume_from=tmp_path / "ck", num_eval_sanity_batch=0)
    assert lrs == pytest.approx([0.05] * 3 + [0.025] * 2)  # steps 4 to 8 continue the schedule
    for before, after in zip(reference, _params(net), strict=True):
        np.testing.assert_array_equal(after, before)
