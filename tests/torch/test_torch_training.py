"""Optimisation through the driver: optimizers, backward/step/zero_grad, precision, clipping, model calls."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from drivetrain._common.errors import BatchMismatchError, DriverError


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
    return torch.optim.SGD(model.parameters(), lr=lr)


# ----------------------------------------------------------------------------- optimizers
def test_fp32_training_reduces_the_loss(model, make_driver, batches) -> None:
    d = make_driver(model)
    d.setup()
    d.set_optimizers(_sgd(model))
    losses = _train(d, batches)
    assert np.mean(losses[-8:]) < 0.5 * np.mean(losses[:8])


def test_several_optimizers_all_step(model, make_driver, batches) -> None:
    d = make_driver(model)
    opts = [
        torch.optim.SGD(model.fc1.parameters(), lr=0.1),
        torch.optim.Adam(model.fc2.parameters(), lr=0.01),
    ]
    d.set_optimizers(opts)
    before = [p.detach().clone() for p in model.parameters()]
    _train(d, batches[:1], epochs=1)
    assert all(not torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))


def test_zero_grad_sets_gradients_to_none(model, make_driver, batches) -> None:
    d = make_driver(model)
    d.set_optimizers(_sgd(model))
    out = d.model_call(batches[0], *d.get_model_call_fn(None))
    d.backward(out["loss"])
    assert all(p.grad is not None for p in model.parameters())
    d.zero_grad()
    assert all(p.grad is None for p in model.parameters())
    d2 = make_driver(model, framework_kwargs={"set_to_none": False})
    d2.set_optimizers(_sgd(model))
    d2.backward(d2.model_call(batches[0], *d2.get_model_call_fn(None))["loss"])
    d2.zero_grad()
    assert all(p.grad is not None and not p.grad.any() for p in model.parameters())


class _ForeignOptimizer:
    """Stands in for another framework's optimizer: only its module name matters."""

    __module__ = "paddle.optimizer.adam"


@pytest.mark.parametrize(
    "optimizer, fragment",
    [
        (object(), "is not a torch.optim.Optimizer"),
        (_ForeignOptimizer(), "(a paddle object)"),
        (torch.optim.SGD, "is a class, not an optimizer"),
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


def test_optimizer_of_another_model_is_rejected(model, make_driver, tiny_net_cls) -> None:
    d = make_driver(model)
    with pytest.raises(DriverError, match="none of its 4 parameter.* belong to the model TinyNet"):
        d.set_optimizers(_sgd(tiny_net_cls()))
    extra = torch.nn.Parameter(torch.zeros(1))  # some of the model's parameters plus an extra one: fine
    d.set_optimizers(torch.optim.SGD([*model.parameters(), extra], lr=0.1))


# ----------------------------------------------------------------------------------- loss
def test_backward_accepts_a_zero_dim_loss(model, make_driver) -> None:
    d = make_driver(model)
    loss = model.fc1.weight.sum()
    assert loss.dim() == 0
    d.backward(loss)
    assert model.fc1.weight.grad is not None


def test_loss_that_is_not_a_tensor(model, make_driver) -> None:
    d = make_driver(model)
    with pytest.raises(DriverError, match="'loss' is a float .*not a torch tensor.*item"):
        d.backward(1.5)


def test_loss_without_grad(model, make_driver, batches) -> None:
    d = make_driver(model)
    fn, sig = d.get_model_call_fn(None)
    with d.no_grad():
        out = d.model_call(batches[0], fn, sig)
    with pytest.raises(
        DriverError, match="does not require grad: did you compute it under no_grad or detach it"
    ):
        d.backward(out["loss"])
    out = d.model_call(batches[0], fn, sig)
    with pytest.raises(DriverError, match="does not require grad"):
        d.backward(out["loss"].detach())


def test_loss_that_is_not_a_scalar(model, make_driver) -> None:
    d = make_driver(model)
    with pytest.raises(DriverError, match=r"the loss has shape \(8, 4\).*loss.mean\(\)"):
        d.backward(model.fc1.weight * 2)


# ------------------------------------------------------------------------------ precision
def test_fp32_auto_cast_is_a_cached_no_op(model, make_driver, batches) -> None:
    d = make_driver(model)
    assert d.auto_cast() is d.auto_cast()
    with d.auto_cast():
        model(batches[0]["x"])
    assert model.last_hidden_dtype == torch.float32


def test_bf16_on_cpu_casts_and_still_trains(model, make_driver, batches) -> None:
    d = make_driver(model, precision="bf16")
    assert d.grad_scaler is None
    d.set_optimizers(_sgd(model))
    with d.auto_cast():
        out = model(**batches[0])
    assert model.last_hidden_dtype == torch.bfloat16
    assert out["logits"].dtype == torch.bfloat16
    assert model.fc1.weight.dtype == torch.float32  # parameters stay fp32
    losses = _train(d, batches)
    assert np.mean(losses[-8:]) < 0.5 * np.mean(losses[:8])


def test_auto_cast_can_be_nested(model, make_driver) -> None:
    d = make_driver(model, precision="bf16")
    with d.auto_cast():
        with d.auto_cast():
            pass
        assert torch.is_autocast_enabled("cpu")
    assert not torch.is_autocast_enabled("cpu")


def test_fp16_on_cpu_warns_and_uses_a_grad_scaler(model, make_driver, batches) -> None:
    with pytest.warns(UserWarning, match=r"fp16' on CPU runs ~30x slower.*precision='bf16'"):
        d = make_driver(
            model, precision="fp16", framework_kwargs={"grad_scaler_kwargs": {"init_scale": 1024.0}}
        )
    assert d.grad_scaler is not None and d.grad_scaler.get_scale() == 1024.0
    d.set_optimizers(_sgd(model))
    with d.auto_cast():
        model(batches[0]["x"])
    assert model.last_hidden_dtype == torch.float16
    losses = _train(d, batches[:4], epochs=2)
    assert np.isfinite(losses).all()
    assert losses[-1] < losses[0]


def test_fp32_and_bf16_do_not_warn(model, make_driver) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        make_driver(model, precision="fp32")
        make_driver(model, precision="bf16")


def test_bad_grad_scaler_kwargs(model, make_driver) -> None:
    with pytest.warns(UserWarning), pytest.raises(DriverError, match=r"unknown key\(s\) \['scale'\]"):
        make_driver(model, precision="fp16", framework_kwargs={"grad_scaler_kwargs": {"scale": 2.0}})


# ---------------------------------------------------------------------------- grad clipping
def _grad_norm(model) -> float:
    return float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()])))


def _big_grads(d, model, batches) -> None:
    out = d.model_call(batches[0], *d.get_model_call_fn(None))
    d.backward(out["loss"] * 1000.0)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_clip_by_norm_bounds_the_gradient_norm(model, make_driver, batches, precision) -> None:
    # a small initial loss scale keeps the scaled fp16 gradients finite
    kwargs = {"grad_scaler_kwargs": {"init_scale": 4.0}} if precision == "fp16" else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        d = make_driver(model, grad_clip=0.5, precision=precision, framework_kwargs=kwargs)
    # lr=0: the step leaves the weights alone, so the (unscaled, clipped) grads can be inspected after it
    d.set_optimizers(torch.optim.SGD(model.parameters(), lr=0.0))
    _big_grads(d, model, batches)
    assert _grad_norm(model) > 10.0
    d.step()
    assert _grad_norm(model) == pytest.approx(0.5, rel=1e-3)


def test_clip_by_value_bounds_every_gradient(model, make_driver, batches) -> None:
    d = make_driver(model, grad_clip=0.01, grad_clip_type="value")
    d.set_optimizers(torch.optim.SGD(model.parameters(), lr=0.0))
    _big_grads(d, model, batches)
    assert max(float(p.grad.abs().max()) for p in model.parameters()) > 0.01
    d.step()
    assert max(float(p.grad.abs().max()) for p in model.parameters()) <= 0.01 + 1e-9


def test_clipping_covers_every_optimizer(model, make_driver, batches) -> None:
    d = make_driver(model, grad_clip=0.5)
    d.set_optimizers(
        [torch.optim.SGD(model.fc1.parameters(), lr=0.0), torch.optim.SGD(model.fc2.parameters(), lr=0.0)]
    )
    _big_grads(d, model, batches)
    d.step()
    assert _grad_norm(model) == pytest.approx(0.5, rel=1e-3)


# ---------------------------------------------------------------------------- model calls
def test_auto_parameter_matching_ignores_extra_keys(model, make_driver, batches) -> None:
    d = make_driver(model)
    fn, sig = d.get_model_call_fn(None)
    assert fn is model and sig == model.forward  # __call__ runs hooks, forward gives the parameters
    calls = []
    model.register_forward_hook(lambda mod, args, kwargs_or_out: calls.append(1))
    out = d.model_call({**batches[0], "index": torch.arange(16), "text": "abc"}, fn, sig)
    assert out["loss"].dim() == 0 and calls == [1]


def test_missing_parameter_names_it_and_the_batch_keys(model, make_driver) -> None:
    d = make_driver(model)
    fn, sig = d.get_model_call_fn(None)
    with pytest.raises(
        BatchMismatchError, match=r"needs parameter\(s\) \['x'\] but the batch has keys \['inputs', 'y'\]"
    ):
        d.model_call({"inputs": torch.zeros(2, 4), "y": torch.zeros(2, dtype=torch.long)}, fn, sig)


def test_train_step_and_named_methods(make_driver, batches) -> None:
    class WithSteps(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(4, 2)

        def train_step(self, x, y):
            return {"loss": torch.nn.functional.cross_entropy(self.fc(x), y)}

        def predict(self, x):
            return {"pred": self.fc(x).argmax(-1)}

    model = WithSteps()
    d = make_driver(model)
    fn, _ = d.get_model_call_fn(None)
    assert fn == model.train_step
    fn, sig = d.get_model_call_fn("predict", default="evaluate_step")
    assert d.model_call(batches[0], fn, sig)["pred"].shape == (16,)
    with pytest.raises(DriverError, match="has no method 'nope'"):
        d.get_model_call_fn("nope")


def test_without_auto_param_call_the_model_gets_the_whole_batch(make_driver, batches) -> None:
    class WholeBatch(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(4, 2)

        def forward(self, batch):
            return {"loss": torch.nn.functional.cross_entropy(self.fc(batch["x"]), batch["y"])}

    model = WholeBatch()
    d = make_driver(model, model_wo_auto_param_call=True)
    out = d.model_call(batches[0], *d.get_model_call_fn(None))
    assert out["loss"].requires_grad


def test_modes_and_no_grad(model, make_driver, batches) -> None:
    d = make_driver(model)
    d.set_model_mode("eval")
    assert not model.training
    d.set_model_mode("train")
    assert model.training
    with pytest.raises(DriverError, match="'train' or 'eval'"):
        d.set_model_mode("test")
    with d.no_grad():
        assert not torch.is_grad_enabled()
    assert torch.is_grad_enabled()
    with d.no_sync():
        pass
    assert d.unwrap_model() is model


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # importing torch._dynamo warns about torch.jit
def test_unwrap_model_looks_through_torch_compile(model, make_driver) -> None:
    compiled = torch.compile(model)  # lazy: nothing is compiled until it is called
    d = make_driver(compiled)
    assert d.unwrap_model() is model
    assert sorted(d.model_state()) == sorted(model.state_dict())


def test_seed_makes_torch_deterministic(model, make_driver) -> None:
    d = make_driver(model)
    d.seed(123)
    a = torch.rand(3)
    d.seed(123)
    assert torch.equal(a, torch.rand(3))


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
def test_gpu_training_in_each_precision(model, make_driver, batches, precision) -> None:
    if precision == "bf16" and not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bf16")
    d = make_driver(model, "cuda", precision=precision, grad_clip=1.0)
    d.setup()
    assert next(model.parameters()).is_cuda
    d.set_optimizers(_sgd(model))
    assert (d.grad_scaler is not None) == (precision == "fp16")
    with d.auto_cast():
        model(d.move_data_to_device(batches[0])["x"])
    assert (
        model.last_hidden_dtype
        == {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[precision]
    )
    losses = _train(d, batches, epochs=8)
    assert np.isfinite(losses[-8:]).all()
    assert np.mean(losses[-8:]) < 0.5 * np.mean(losses[:8])
