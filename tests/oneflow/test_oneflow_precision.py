"""The fp16 loss scaler (oneflow 0.9 has none for eager training), exercised with real oneflow ops on the CPU."""

from __future__ import annotations

import numpy as np
import pytest

from drivetrain._common.errors import DriverError
from drivetrain_oneflow.precision import LossScaler, Precision

from .conftest import flow

pytestmark = pytest.mark.oneflow


def _param(grad: list[float]):
    p = flow.nn.Parameter(flow.zeros(len(grad)))
    p.grad = flow.tensor(grad)
    return p


class Counting:
    def __init__(self) -> None:
        self.steps = 0

    def step(self) -> None:
        self.steps += 1


def test_scaled_gradients_are_unscaled_before_the_step() -> None:
    scaler = LossScaler(init_scale=8.0)
    assert float(scaler.scale_loss(flow.tensor(0.5)).numpy()) == 4.0
    p, opt = _param([8.0, -16.0]), Counting()
    assert scaler.step([opt], lambda: [p])
    np.testing.assert_array_equal(p.grad.numpy(), [1.0, -2.0])
    assert opt.steps == 1 and scaler.scale == 8.0


def test_an_overflowing_step_is_skipped_and_the_scale_backs_off_then_grows() -> None:
    scaler = LossScaler(init_scale=1024.0, growth_interval=2)
    opt = Counting()
    assert not scaler.step([opt], lambda: [_param([1.0, float("inf")])])
    assert opt.steps == 0 and scaler.scale == 512.0 and scaler.skipped_steps == 1
    assert not scaler.step([opt], lambda: [_param([float("nan")])])
    assert scaler.scale == 256.0
    for _ in range(2):
        assert scaler.step([opt], lambda: [_param([1.0])])
    assert opt.steps == 2 and scaler.scale == 512.0  # two good steps in a row: grown once


def test_unscaling_happens_once_per_step_even_when_clipping_asked_first() -> None:
    scaler = LossScaler(init_scale=4.0)
    p = _param([4.0])
    assert scaler.unscale([p])
    assert scaler.step([Counting()], lambda: [p])
    np.testing.assert_array_equal(p.grad.numpy(), [1.0])  # divided by 4 once, not twice


def test_scaler_state_round_trips() -> None:
    scaler = LossScaler(init_scale=64.0, growth_interval=3)
    scaler.step([Counting()], lambda: [_param([float("inf")])])
    scaler.step([Counting()], lambda: [_param([1.0])])
    other = LossScaler()
    other.load_state_dict(scaler.state_dict())
    assert other.state_dict() == scaler.state_dict() == {"scale": 32.0, "growth_tracker": 1, "growth_factor": 2.0,
                                                         "backoff_factor": 0.5, "growth_interval": 3}
    with pytest.raises(DriverError, match=r"lacks \['scale'\]"):
        other.load_state_dict({"growth_tracker": 1})


@pytest.mark.parametrize(("kwargs", "fragment"), [
    ({"init_scale": 0}, "init_scale"), ({"growth_factor": 1.0}, "growth_factor"),
    ({"backoff_factor": 1.5}, "backoff_factor"), ({"growth_interval": 0}, "growth_interval"),
])
def test_bad_scaler_options(kwargs, fragment) -> None:
    with pytest.raises(DriverError, match=fragment):
        LossScaler(**kwargs)


def test_precision_on_cpu_has_no_scaler_and_says_so() -> None:
    with pytest.warns(UserWarning, match="oneflow 0.9 has no CPU autocast"):
        precision = Precision("fp16", flow.device("cpu"))
    assert precision.scaler is None and not precision.active
    assert precision.describe() == "fp16 (runs in fp32 on CPU)"  # what describe() of the driver shows
    assert precision.state() is None
    with pytest.warns(UserWarning, match="ignored"):
        precision.load_state({"scale": 2.0, "growth_tracker": 0})
