"""Training through the oneflow driver on CPU: steps, optimizers, clipping, modes, data, schedulers, precision."""

from __future__ import annotations

import dataclasses
import warnings
from collections import namedtuple

import numpy as np
import pytest

from drivetrain import Accuracy, Event, LRSchedulerCallback, Trainer, seed_everything
from drivetrain._common.errors import DriverError

from .conftest import TinyNet, flow, make_batches, tiny_net

pytestmark = pytest.mark.oneflow


def _params(model) -> list[np.ndarray]:
    return [p.numpy().copy() for p in model.parameters()]


def _sgd(model, lr=0.1):
    return flow.optim.SGD(model.parameters(), lr=lr)


def _train(driver, batch) -> None:
    fn, sig = driver.get_model_call_fn(None)
    with driver.auto_cast():
        out = driver.model_call(driver.move_data_to_device(batch), fn, sig)
    driver.backward(out["loss"])


def separable(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 4)).astype(np.float32)
    return x, (x[:, 0] + x[:, 1] > 0).astype(np.int64)


# ---------------------------------------------------------------- optimisation
def test_fp32_training_reduces_the_loss(model, make_driver, batches) -> None:
    d = make_driver(model)
    d.set_optimizers(_sgd(model, 0.5))
    d.setup()
    fn, sig = d.get_model_call_fn(None)
    first = float(d.model_call(batches[0], fn, sig)["loss"].numpy())
    for _ in range(3):
        for batch in batches:
            _train(d, batch)
            d.step()
            d.zero_grad()
    assert float(d.model_call(batches[0], fn, sig)["loss"].numpy()) < first * 0.5


def test_one_step_equals_a_hand_written_sgd_step(model, make_driver, batches) -> None:
    expected = tiny_net()
    out = expected(batches[0]["x"], batches[0]["y"])
    out["loss"].backward()
    with flow.no_grad():
        manual = [(p - 0.1 * p.grad).numpy() for p in expected.parameters()]
    d = make_driver(model)
    d.set_optimizers(_sgd(model))
    d.setup()
    _train(d, batches[0])
    d.step()
    for got, want in zip(_params(model), manual, strict=True):
        np.testing.assert_array_equal(got, want)


def test_several_optimizers_all_step(model, make_driver, batches) -> None:
    d = make_driver(model)
    d.set_optimizers([flow.optim.SGD(model.fc1.parameters(), lr=0.1), flow.optim.Adam(model.fc2.parameters(), lr=0.1)])
    before = _params(model)
    _train(d, batches[0])
    d.step()
    assert all((a != b).any() for a, b in zip(before, _params(model), strict=True))


def test_zero_grad_fills_zeros_in_place(model, make_driver, batches) -> None:
    d = make_driver(model)
    d.set_optimizers(_sgd(model))
    _train(d, batches[0])
    grad = model.fc1.weight.grad
    assert float(grad.abs().sum().numpy()) > 0
    d.zero_grad()
    assert model.fc1.weight.grad is not None and float(model.fc1.weight.grad.abs().sum().numpy()) == 0.0


@pytest.mark.parametrize(
    ("optimizer", "fragment"),
    [
        (lambda m: flow.optim.SGD, "is a class, not an optimizer"),
        (lambda m: object(), "is not a oneflow.optim.Optimizer"),
        (lambda m: flow.optim.SGD(TinyNet().parameters(), lr=0.1), "none of its 4 parameter"),
    ],
)
def test_wrong_optimizers_are_rejected(model, make_driver, optimizer, fragment) -> None:
    d = make_driver(model)
    with pytest.raises(DriverError, match=fragment):
        d.set_optimizers(optimizer(model))


def test_bad_losses_are_explained(model, make_driver, batches) -> None:
    d = make_driver(model)
    with pytest.raises(DriverError, match="is a float .* not a oneflow tensor"):
        d.backward(1.5)
    with flow.no_grad():
        loss = model(batches[0]["x"], batches[0]["y"])["loss"]
    with pytest.raises(DriverError, match="does not require grad"):
        d.backward(loss)
    logits = model(batches[0]["x"])["logits"]
    with pytest.raises(DriverError, match=r"has shape \(16, 2\); backward needs a single number"):
        d.backward(logits)


@pytest.mark.parametrize("clip_type", ["norm", "value"])
def test_grad_clip_bounds_the_gradients_the_optimizer_sees(model, make_driver, batches, clip_type) -> None:
    d = make_driver(model, grad_clip=0.01, grad_clip_type=clip_type)
    d.set_optimizers(_sgd(model, 1.0))
    before = _params(model)
    _train(d, batches[0])
    d.step()
    grads = [b - a for a, b in zip(_params(model), before, strict=True)]  # lr=1: the step is the gradient
    if clip_type == "norm":
        total = np.sqrt(sum(float((g.astype(np.float64) ** 2).sum()) for g in grads))
        assert total == pytest.approx(0.01, rel=1e-4)
    else:
        assert max(float(np.abs(g).max()) for g in grads) <= 0.01 + 1e-7


def test_bad_clip_and_precision_arguments(model, make_driver) -> None:
    with pytest.raises(DriverError, match="grad_clip=-1 must be a positive number"):
        make_driver(model, grad_clip=-1)
    with pytest.raises(DriverError, match="grad_clip_type='l3'"):
        make_driver(model, grad_clip=1.0, grad_clip_type="l3")
    with pytest.raises(DriverError, match="precision='fp8' is not supported by driver 'oneflow'"):
        make_driver(model, precision="fp8")


def test_oneflow_kwargs_are_checked(model, make_driver) -> None:
    with pytest.raises(DriverError, match=r"oneflow_kwargs\['nonsense'\] is not an option of this driver"):
        make_driver(model, framework_kwargs={"nonsense": 1})
    with pytest.raises(DriverError, match=r"oneflow_kwargs\['ddp_kwargs'\] applies to distributed oneflow training"):
        make_driver(model, framework_kwargs={"ddp_kwargs": {}})
    with pytest.raises(DriverError, match="must be a dict or None"):
        make_driver(model, framework_kwargs=[1])
    with pytest.raises(DriverError, match=r"grad_scaler_kwargs'\] only applies to precision='fp16'"):
        make_driver(model, framework_kwargs={"grad_scaler_kwargs": {}})


# ------------------------------------------------------------------- model calls
def test_auto_parameter_matching_and_whole_batch_calls(make_driver) -> None:
    class Picky(flow.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = flow.nn.Linear(4, 2)
            self.seen = []

        def forward(self, x, y):
            self.seen.append(("forward", x.shape[0]))
            return {"loss": flow.nn.functional.cross_entropy(self.fc(x), y)}

        def train_step(self, x, y):
            self.seen.append(("train_step", x.shape[0]))
            return self.forward(x, y)

    batch = dict(make_batches(1)[0], extra="ignored", index=np.arange(16))
    net = Picky()
    d = make_driver(net)
    fn, sig = d.get_model_call_fn(None)  # train_step when defined
    d.model_call(batch, fn, sig)
    assert net.seen == [("train_step", 16), ("forward", 16)]
    net.seen.clear()
    fn, sig = d.get_model_call_fn(None, default="evaluate_step")  # falls back to forward through __call__
    d.model_call(batch, fn, sig)
    assert net.seen == [("forward", 16)]
    whole = make_driver(net, model_wo_auto_param_call=True)
    fn, sig = whole.get_model_call_fn("train_step")
    with pytest.raises(TypeError):
        whole.model_call(batch, fn, sig)  # the whole dict is passed as one argument
    with pytest.raises(DriverError, match="has no method 'nope'"):
        d.get_model_call_fn("nope")


def test_train_and_eval_modes_and_no_grad(make_driver) -> None:
    net = flow.nn.Sequential(flow.nn.Linear(4, 4), flow.nn.Dropout(0.5))
    d = make_driver(net)
    d.set_model_mode("eval")
    assert not net.training and not net[1].training
    x = flow.ones(2, 4)
    with d.no_grad():
        out = net(x)
    assert not out.requires_grad
    np.testing.assert_array_equal(net(x).detach().numpy(), net(x).detach().numpy())  # eval: no dropout
    d.set_model_mode("train")
    assert net.training and net[1].training
    with pytest.raises(DriverError, match="accepts 'train' or 'eval'"):
        d.set_model_mode("test")


# -------------------------------------------------------------------------- data
def test_move_data_keeps_nested_structure_and_converts_numpy(model, make_driver) -> None:
    Pair = namedtuple("Pair", "a b")

    @dataclasses.dataclass
    class Holder:
        t: object
        label: str

    d = make_driver(model)
    t = flow.ones(2)
    batch = {"pair": Pair(t, [t, 3]), "holder": Holder(np.zeros(3, np.float32), "x"), "text": "hi",
             "ids": np.arange(3), "objects": np.array(["a"], dtype=object), "u16": np.zeros(2, np.uint16)}
    moved = d.move_data_to_device(batch)
    assert isinstance(moved["pair"], Pair) and moved["pair"].a is t and moved["pair"].b[0] is t
    assert moved["pair"].b[1] == 3 and moved["text"] == "hi"
    assert isinstance(moved["holder"], Holder) and isinstance(moved["holder"].t, flow.Tensor)
    assert moved["holder"].label == "x" and batch["holder"].t.__class__ is np.ndarray  # the input is untouched
    assert moved["ids"].dtype == flow.int64 and moved["ids"].numpy().tolist() == [0, 1, 2]
    assert moved["objects"] is batch["objects"] and moved["u16"] is batch["u16"]  # no oneflow dtype: left alone


def test_a_batch_already_in_place_comes_back_as_is(model, make_driver, batches) -> None:
    d = make_driver(model)
    assert d.move_data_to_device(batches[0]) is batches[0]
    nested = [batches[0], (batches[1]["x"],)]
    assert d.move_data_to_device(nested) is nested


def test_tensor_to_numpy_copies_and_widens_low_precision(model, make_driver) -> None:
    d = make_driver(model)
    t = flow.tensor([1.5, -2.0])
    array = d.tensor_to_numpy(t)
    array[0] = 99.0
    assert t.numpy()[0] == 1.5  # a copy, not a view of the tensor
    for dtype in (flow.float16, flow.bfloat16):
        widened = d.tensor_to_numpy(t.to(dtype))
        assert widened.dtype == np.float32 and widened.tolist() == [1.5, -2.0]
    assert d.tensor_to_numpy(flow.tensor([3], dtype=flow.int64)).dtype == np.int64
    assert d.tensor_to_numpy([1, 2]).tolist() == [1, 2]
    assert d.is_tensor(t) and not d.is_tensor(array)


def test_a_dataset_is_not_a_dataloader(model) -> None:
    class Table(flow.utils.data.Dataset):
        def __len__(self) -> int:
            return 4

        def __getitem__(self, i):
            return {"x": np.zeros(4, np.float32), "y": np.int64(0)}

    with pytest.raises(DriverError, match=r"train_dataloader=Table is a Dataset, not a dataloader"):
        Trainer(model, Table(), _sgd(model), driver="oneflow", progress_bar=None)


def test_plain_iterable_of_numpy_batches_trains_and_evaluates(model) -> None:
    x, y = separable(256)
    train = [{"x": x[i:i + 32], "y": y[i:i + 32]} for i in range(0, 192, 32)]
    dev = [{"x": x[i:i + 32], "y": y[i:i + 32], "target": y[i:i + 32]} for i in range(192, 256, 32)]
    trainer = Trainer(model, train, _sgd(model, 0.5), driver="oneflow", n_epochs=8, evaluate_dataloaders=dev,
                      metrics={"acc": Accuracy()}, output_mapping={"logits": "pred"}, progress_bar=None)
    trainer.run(num_eval_sanity_batch=1)
    assert trainer.evaluate()["acc#acc"] >= 0.9


class Points(flow.utils.data.Dataset):
    def __init__(self, n: int = 96, seed: int = 0) -> None:
        self.x, self.y = separable(n, seed)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict:
        return {"x": self.x[i], "y": self.y[i]}


def test_oneflow_dataloader_trains_with_driver_auto(model) -> None:
    loader = flow.utils.data.DataLoader(Points(), batch_size=16, shuffle=True)
    trainer = Trainer(model, loader, flow.optim.Adam(model.parameters(), lr=0.05), driver="auto", n_epochs=4,
                      progress_bar=None)
    assert trainer.driver.name == "oneflow"
    trainer.run()
    x, y = separable(64, seed=5)
    model.eval()
    pred = model(flow.tensor(x))["logits"].numpy().argmax(-1)
    assert (pred == y).mean() >= 0.9


def test_lr_scheduler_is_stepped_by_the_callback_and_resumes(tmp_path) -> None:
    loader = flow.utils.data.DataLoader(Points(64), batch_size=8, shuffle=True)

    def build():
        seed_everything(0)  # oneflow's global generator decides the shuffling seed
        net = tiny_net()
        opt = flow.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
        scheduler = flow.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
        lrs = []
        trainer = Trainer(net, loader, opt, driver="oneflow", n_epochs=2, accumulation_steps=2, progress_bar=None,
                          callbacks=[LRSchedulerCallback(scheduler)])
        trainer.add_callback_fn(Event.on_before_optimizers_step(),
                                lambda t, opts: lrs.append(opts[0].param_groups[0]["lr"]))
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


# ---------------------------------------------------------------------- precision
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_low_precision_on_cpu_warns_and_trains_in_fp32(batches, precision) -> None:
    results = {}
    for name in ("fp32", precision):
        net = tiny_net()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer = Trainer(net, batches, _sgd(net), driver="oneflow", precision=name, n_epochs=1,
                              progress_bar=None)
        if name != "fp32":
            assert any("oneflow 0.9 has no CPU autocast" in str(w.message) for w in caught)
            assert trainer.driver.precision_state() is None  # no loss scaler on CPU
        trainer.run(num_eval_sanity_batch=0)
        results[name] = _params(net)
    for a, b in zip(results["fp32"], results[precision], strict=True):
        np.testing.assert_array_equal(a, b)


def test_capabilities_tell_the_truth_about_precision() -> None:
    from drivetrain import available_drivers

    caps = available_drivers()["oneflow"].capabilities
    assert caps.precisions == ("fp32", "fp16", "bf16") and caps.distributed == ("ddp",)
    assert "no CPU autocast" in caps.notes["fp16"] and "on CPU the driver warns" in caps.notes["bf16"]


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_mixed_precision_on_gpu(batches, precision) -> None:
    net = tiny_net()
    trainer = Trainer(net, batches, _sgd(net, 0.5), driver="oneflow", device="cuda", precision=precision,
                      n_epochs=3, progress_bar=None)
    trainer.run(num_eval_sanity_batch=0)
    net.eval()
    with flow.no_grad():
        loss = float(net(batches[0]["x"].to("cuda"), batches[0]["y"].to("cuda"))["loss"].numpy())
    assert np.isfinite(loss) and loss < 0.5
    assert (trainer.driver.precision_state() is not None) == (precision == "fp16")
