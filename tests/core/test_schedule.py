"""WarmupSchedule on the numpy driver: the shapes, accumulation, exact resume, and every bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest

from drivetrain import (
    CallbackError,
    CheckpointCallback,
    ConfigurationError,
    DriverError,
    Event,
    LRSchedulerCallback,
    Trainer,
    WarmupSchedule,
    seed_everything,
)
from drivetrain._callbacks.schedule import schedule_factor
from drivetrain._data import AccumulationCycle
from drivetrain_numpy import SGD, ArrayLoader, LinearModel
from drivetrain_numpy.driver import NumpyDriver

from ._callback_helpers import BATCHES_PER_EPOCH, assert_same_params, make_trainer, stop_after
from .conftest import make_regression

BASE = 0.05  # make_trainer's SGD learning rate


def recorded(trainer: Trainer) -> list[float]:
    """The learning rate each optimizer step of ``trainer`` uses, in order."""
    lrs: list[float] = []
    trainer.add_callback_fn(Event.on_before_optimizers_step(), lambda t, opts: lrs.append(opts[0].lr))
    return lrs


# Independent statements of the three shapes for optimizer step t = 1..T (W warmup steps, floor m).
def linear(t: int, w: int, total: int, m: float = 0.0) -> float:
    if t <= w:
        return t / w
    return m + (1 - m) * (total - t + 1) / (total - w)


def cosine(t: int, w: int, total: int, m: float = 0.0) -> float:
    if t <= w:
        return t / w
    return m + (1 - m) * (1 + math.cos(math.pi * (t - 1 - w) / (total - w))) / 2


def constant(t: int, w: int, total: int, m: float = 0.0) -> float:
    return t / w if t <= w else 1.0


SHAPES = {"linear": linear, "cosine": cosine, "constant": constant}


# ------------------------------------------------------------------------ shapes
@pytest.mark.parametrize("kind", ["linear", "cosine", "constant"])
@pytest.mark.parametrize("warmup", [{"warmup_steps": 4}, {"warmup_ratio": 0.1}, {}])
def test_every_step_uses_the_shape(kind, warmup):
    trainer = make_trainer([WarmupSchedule(kind, **warmup)], n_epochs=3)
    lrs = recorded(trainer)
    trainer.run()
    total = 3 * BATCHES_PER_EPOCH  # 39 steps: one per batch
    w = {"warmup_steps": 4, "warmup_ratio": 4}.get(next(iter(warmup), None), 0)  # ceil(0.1 * 39) = 4
    assert len(lrs) == total
    expected = [BASE * SHAPES[kind](t, w, total) for t in range(1, total + 1)]
    np.testing.assert_allclose(lrs, expected, rtol=1e-12, atol=0)
    end = {"linear": 0.0, "cosine": 0.0, "constant": BASE}[kind]
    assert trainer.driver.optimizers[0].lr == pytest.approx(end, abs=1e-15)  # what is left after the last step


def test_key_steps_by_hand():
    """warmup_steps=2 of 6 steps at base 0.1: warmup 0.05, 0.1, then the decay from the full rate."""
    expected = {
        "linear": [0.05, 0.1, 0.1, 0.075, 0.05, 0.025, 0.0],
        "cosine": [0.05, 0.1, 0.1, 0.1 * (2 + 2 ** 0.5) / 4, 0.05, 0.1 * (2 - 2 ** 0.5) / 4, 0.0],
        "constant": [0.05, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1],
    }
    for kind, rates in expected.items():
        schedule = WarmupSchedule(kind, warmup_steps=2, total_steps=6)
        got = [0.1 * schedule.factor(step) for step in range(7)]
        np.testing.assert_allclose(got, rates, rtol=1e-12, atol=1e-17, err_msg=kind)


def test_min_lr_ratio_is_the_floor_of_the_decay():
    for kind in ("linear", "cosine"):
        factors = [schedule_factor(kind, s, 3, 10, 0.1) for s in range(13)]
        assert factors[:4] == [1 / 3, 2 / 3, 1.0, 1.0]
        assert factors[10] == factors[12] == pytest.approx(0.1)
        assert all(a >= b for a, b in zip(factors[2:-1], factors[3:], strict=True))  # never rises after the warmup


def test_warmup_ratio_rounds_up_without_float_noise():
    schedule = WarmupSchedule("linear", warmup_ratio=0.1, total_steps=30)
    assert [round(schedule.factor(s), 12) for s in range(4)] == [round(1 / 3, 12), round(2 / 3, 12), 1.0, 1.0]
    schedule = WarmupSchedule("linear", warmup_ratio=0.1, total_steps=31)  # 3.1 steps: 4
    assert schedule.factor(2) == 0.75


def test_no_warmup_starts_at_the_base_rate():
    assert schedule_factor("linear", 0, 0, 10) == 1.0
    assert schedule_factor("cosine", 0, 0, 10) == 1.0
    assert schedule_factor("constant", 5, 0, None) == 1.0


def test_all_warmup():
    assert [schedule_factor("linear", s, 4, 4) for s in range(5)] == [0.25, 0.5, 0.75, 1.0, 0.0]


# ------------------------------------------------------------------ step counts
@pytest.mark.parametrize("n_batches, accumulation, expected", [
    (-1, 1, 39), (-1, 3, 15), (-1, 2, 21), (20, 3, 8), (13, 5, 3), (7, 1, 7),
])
def test_the_schedule_spans_the_optimizer_steps_of_the_run(n_batches, accumulation, expected):
    """13 batches per epoch: each epoch closes its last (short) accumulation cycle with a step."""
    trainer = make_trainer([WarmupSchedule("linear", warmup_steps=1)], n_epochs=3, accumulation_steps=accumulation,
                           n_batches=n_batches)
    lrs = recorded(trainer)
    trainer.run()
    assert len(lrs) == expected
    np.testing.assert_allclose(lrs, [BASE * linear(t, 1, expected) for t in range(1, expected + 1)], rtol=1e-12)
    assert trainer.driver.optimizers[0].lr == 0.0  # reached exactly after the last step


def test_the_rate_changes_only_when_the_optimizer_steps():
    trainer = make_trainer([WarmupSchedule("linear", warmup_steps=2)], n_epochs=1, accumulation_steps=3)
    per_batch = []
    trainer.add_callback_fn(Event.on_train_batch_begin(), lambda t, b, i: per_batch.append(t.driver.optimizers[0].lr))
    trainer.run()
    # 13 batches in cycles 3,3,3,3,1: 5 steps, the rate of step t held for the batches of its cycle
    rates = [BASE * linear(t, 2, 5) for t in range(1, 6)]
    np.testing.assert_allclose(per_batch, [rates[0]] * 3 + [rates[1]] * 3 + [rates[2]] * 3 + [rates[3]] * 3
                               + [rates[4]], rtol=1e-12)


def test_planned_optimizer_steps():
    assert AccumulationCycle(1).optimizer_steps(None, 13) is None
    assert AccumulationCycle(3).optimizer_steps(39, 13) == 15
    assert AccumulationCycle(3).optimizer_steps(10, None) == 4  # no epoch length: cycles of 3 throughout
    assert AccumulationCycle(1).optimizer_steps(0, 13) == 0


def test_the_accumulation_cycle_closes_every_kth_batch_and_each_epochs_last():
    cycle = AccumulationCycle(3)
    assert [cycle.closes(i, 8) for i in range(8)] == [False, False, True, False, False, True, False, True]
    assert [cycle.size(i, 8) for i in range(8)] == [3, 3, 3, 3, 3, 3, 2, 2]
    assert [cycle.closes(i, None) for i in range(4)] == [False, False, True, False]  # no length: every 3rd
    assert all(AccumulationCycle(1).closes(i, 5) and AccumulationCycle(1).size(i, 5) == 1 for i in range(5))


def test_every_optimizer_and_its_own_base_rate():
    model = LinearModel(3, 1)
    optimizers = [SGD(model.params, model.grads, lr=0.02), SGD(model.params, model.grads, lr=0.03)]
    loader = ArrayLoader(make_regression(n=40), batch_size=8)
    trainer = Trainer(model, loader, optimizers, driver="numpy", n_epochs=1, progress_bar=None,
                      callbacks=[WarmupSchedule("linear", warmup_steps=2)])
    seen = []
    trainer.add_callback_fn(Event.on_before_optimizers_step(), lambda t, opts: seen.append([o.lr for o in opts]))
    trainer.run()
    np.testing.assert_allclose(seen, [[0.02 * f, 0.03 * f] for f in (0.5, 1.0, 1.0, 2 / 3, 1 / 3)], rtol=1e-12)
    assert trainer.driver.get_lrs() == [[0.0], [0.0]]


def test_constant_warmup_needs_no_length():
    """A constant schedule warmed up by steps works on a dataloader without len()."""
    data = make_regression(n=40)
    batches = [{k: v[i:i + 8] for k, v in data.items()} for i in range(0, 40, 8)]
    model = LinearModel(3, 1)
    trainer = Trainer(model, iter(batches), SGD(model.params, model.grads, lr=0.1), driver="numpy", n_epochs=1,
                      progress_bar=None, callbacks=[WarmupSchedule("constant", warmup_steps=4)])
    lrs = recorded(trainer)
    trainer.run()
    np.testing.assert_allclose(lrs, [0.025, 0.05, 0.075, 0.1, 0.1], rtol=1e-12)


# ----------------------------------------------------------------------- resume
@pytest.mark.parametrize("kind, stop, accumulation", [
    ("linear", 8, 3),  # resumed after batch 7: inside an accumulation cycle, during the warmup
    ("cosine", 14, 3),  # after batch 13: the end of epoch 0
    ("cosine", 21, 1),  # in the middle of the decay
    ("constant", 3, 1),  # during the warmup
])
def test_a_resumed_run_continues_the_schedule_exactly(kind, stop, accumulation, tmp_path):
    def build(folder=None):
        first = [CheckpointCallback(folder, every_n_batches=stop - 1, save_last=False)] if folder else []
        trainer = make_trainer([*first, WarmupSchedule(kind, warmup_ratio=0.3)], accumulation_steps=accumulation)
        return trainer, recorded(trainer)

    seed_everything(0)
    reference, ref_lrs = build()
    reference.run()

    seed_everything(0)
    first, _ = build(tmp_path)
    stop_after(first, stop)
    with pytest.raises(CallbackError):
        first.run()
    seed_everything(5)
    resumed, lrs = build(tmp_path)
    resumed.run(resume_from=tmp_path)
    assert lrs and lrs == ref_lrs[len(ref_lrs) - len(lrs):]  # the same floats, bit for bit
    assert resumed.driver.get_lrs() == reference.driver.get_lrs()
    schedule, ref_schedule = resumed.callbacks[1], reference.callbacks[0]
    assert (schedule.steps, schedule.base_lrs) == (ref_schedule.steps, ref_schedule.base_lrs)
    assert_same_params(resumed, reference)


def test_the_base_rates_come_from_the_checkpoint_not_the_new_optimizer(tmp_path):
    first = make_trainer([WarmupSchedule("linear", warmup_steps=3)], n_epochs=1)
    first.run()
    first.save_checkpoint(tmp_path / "ckpt")
    state = first.callbacks[0].on_save_checkpoint(first)
    assert state["steps"] == BATCHES_PER_EPOCH and state["base_lrs"] == [[BASE]]
    resumed = make_trainer([WarmupSchedule("linear", warmup_steps=3)], n_epochs=2, lr=0.5)
    resumed.load_checkpoint(tmp_path / "ckpt")
    assert resumed.callbacks[0].base_lrs == [[BASE]] and resumed.callbacks[0].steps == BATCHES_PER_EPOCH


def test_resume_training_false_restarts_the_schedule_from_the_optimizers_rates(tmp_path):
    first = make_trainer([WarmupSchedule("linear", warmup_steps=3)], n_epochs=1)
    first.run()
    first.save_checkpoint(tmp_path / "ckpt")  # its optimizer state holds the decayed rate, 0.0
    again = make_trainer([WarmupSchedule("linear", warmup_steps=3)], n_epochs=1)
    lrs = recorded(again)
    again.run(resume_from=tmp_path / "ckpt", resume_training=False)
    np.testing.assert_allclose(lrs[:3], [BASE / 3, BASE * 2 / 3, BASE], rtol=1e-12)


def test_a_changed_run_length_on_resume_is_reported(tmp_path):
    first = make_trainer([WarmupSchedule("linear")], n_epochs=2)
    stop_after(first, 5)
    first.add_callback_fn(Event.on_train_batch_end(), lambda t: t.save_checkpoint(tmp_path / "c")
                          if t.global_forward_batches == 4 else None)
    with pytest.raises(CallbackError):
        first.run()
    longer = make_trainer([WarmupSchedule("linear")], n_epochs=3)
    with pytest.warns(RuntimeWarning, match=r"spans 26 optimizer steps but this run has 39"):
        longer.run(resume_from=tmp_path / "c")


# ------------------------------------------------------------------- bad inputs
@pytest.mark.parametrize("kwargs, match", [
    ({"kind": "cosin"}, r"kind='cosin'\) is not accepted; did you mean 'cosine'\? Pass one of"),
    ({"kind": "constant_with_warmup"}, r"Hugging Face's 'constant_with_warmup' is kind='constant' here"),
    ({"kind": 3}, r"kind=3\) is not accepted; pass one of 'linear', 'cosine', 'constant'"),
    ({"warmup_steps": 3, "warmup_ratio": 0.1}, r"give one of them, not both"),
    ({"warmup_steps": -1}, r"warmup_steps=-1\) is not accepted; pass an int >= 0"),
    ({"warmup_steps": 2.5}, r"warmup_steps=2.5\) is not accepted"),
    ({"warmup_steps": True}, r"warmup_steps=True\) is not accepted"),
    ({"warmup_ratio": 1.5}, r"warmup_ratio=1.5\) is not accepted; pass a number from 0 to 1"),
    ({"warmup_ratio": -0.1}, r"warmup_ratio=-0.1\) is not accepted"),
    ({"warmup_ratio": float("nan")}, r"warmup_ratio=nan\) is not accepted"),
    ({"warmup_ratio": "10%"}, r"warmup_ratio='10%'\) is not accepted"),
    ({"total_steps": 0}, r"total_steps=0\) is not accepted; pass an int >= 1"),
    ({"min_lr_ratio": 2}, r"min_lr_ratio=2\) is not accepted; pass a number from 0 to 1"),
    ({"kind": "constant", "min_lr_ratio": 0.1}, r"a constant schedule does not decay"),
    ({"warmup_steps": 10, "total_steps": 5}, r"warmup is longer than the whole schedule"),
])
def test_bad_arguments_fail_at_construction(kwargs, match):
    with pytest.raises(ConfigurationError, match=match):
        WarmupSchedule(**kwargs)


def test_a_warmup_longer_than_the_run_fails_when_training_begins():
    trainer = make_trainer([WarmupSchedule("linear", warmup_steps=50)], n_epochs=1)
    with pytest.raises(ConfigurationError, match=r"warmup_steps=50\): the warmup is longer than the 13 optimizer"):
        trainer.run()


def test_an_unknown_run_length_names_the_arguments_to_pass():
    data = make_regression(n=40)
    batches = ({k: v[i:i + 8] for k, v in data.items()} for i in range(0, 40, 8))
    model = LinearModel(3, 1)
    trainer = Trainer(model, batches, SGD(model.params, model.grads, lr=0.1), driver="numpy", n_epochs=1,
                      progress_bar=None, callbacks=[WarmupSchedule("cosine", warmup_ratio=0.1)])
    with pytest.raises(ConfigurationError, match=r"has no len\(\) and the Trainer has no n_batches\); pass "
                                                 r"total_steps= to WarmupSchedule or n_batches= to the Trainer"):
        trainer.run()


def test_factor_without_a_length_says_what_to_pass():
    with pytest.raises(ConfigurationError, match=r"needs the number of optimizer steps; pass total_steps="):
        WarmupSchedule("linear").factor(3)


class OldDriver(NumpyDriver):
    """A backend written before get_lrs/set_lrs existed."""

    name = "numpy"
    get_lrs = NumpyDriver.__mro__[1].get_lrs
    set_lrs = NumpyDriver.__mro__[1].set_lrs


def test_a_driver_without_learning_rate_access_is_refused_when_the_trainer_is_built():
    model = LinearModel(3, 1)
    driver = OldDriver(model)
    with pytest.raises(CallbackError, match=r"cannot read learning rates: its backend does not implement "
                                            r"Driver.get_lrs\(\)/set_lrs\(\).*LRSchedulerCallback"):
        Trainer(model, ArrayLoader(make_regression(), batch_size=8), SGD(model.params, model.grads), driver=driver,
                progress_bar=None, callbacks=[WarmupSchedule("linear")])


def test_old_drivers_still_train_without_a_schedule():
    model = LinearModel(3, 1)
    trainer = Trainer(model, ArrayLoader(make_regression(), batch_size=8), SGD(model.params, model.grads),
                      driver=OldDriver(model), n_epochs=1, progress_bar=None)
    trainer.run()
    with pytest.raises(DriverError, match="cannot set learning rates"):
        trainer.driver.set_lrs([[0.1]])


@pytest.mark.parametrize("lrs, match", [
    (0.1, r"set_lrs\(lrs=0.1\) needs one list per optimizer \(1 here\), each with one rate per param group \(\[1\]"),
    ([[0.1], [0.2]], r"needs one list per optimizer \(1 here\)"),
    ([[0.1, 0.2]], r"lrs\[0\]=\[0.1, 0.2\] does not fit"),
    ([[-0.1]], r"lrs\[0\]\[0\]=-0.1 is not a learning rate; pass a finite number >= 0"),
    ([[float("inf")]], r"lrs\[0\]\[0\]=inf is not a learning rate"),
    ([[True]], r"lrs\[0\]\[0\]=True is not a learning rate"),
    ([["0.1"]], r"lrs\[0\]\[0\]='0.1' is not a learning rate"),
])
def test_set_lrs_refuses_what_does_not_fit(lrs, match):
    model = LinearModel(3, 1)
    trainer = Trainer(model, ArrayLoader(make_regression(), batch_size=8), SGD(model.params, model.grads, lr=0.1),
                      driver="numpy", progress_bar=None)
    with pytest.raises(DriverError, match=match):
        trainer.driver.set_lrs(lrs)
    assert trainer.driver.get_lrs() == [[0.1]]


def test_a_checkpoint_for_other_param_groups_is_refused(tmp_path):
    schedule = WarmupSchedule("linear")
    trainer = make_trainer([schedule])
    with pytest.raises(ConfigurationError, match=r"schedules param groups \[1, 1\] \(per optimizer\) but this "
                                                 r"Trainer's optimizers have \[1\]"):
        schedule.on_load_checkpoint(trainer, {"steps": 3, "base_lrs": [[0.1], [0.1]], "kind": "linear"})
    with pytest.raises(ConfigurationError, match=r"not what WarmupSchedule saves"):
        schedule.on_load_checkpoint(trainer, {"batches": 3})


class Halving:
    """A framework-free learning-rate scheduler: halves the numpy SGD's rate at each step."""

    def __init__(self, optimizer) -> None:
        self.optimizer = optimizer

    def step(self) -> None:
        self.optimizer.lr *= 0.5


def _trainer_with(callbacks_of):
    model = LinearModel(3, 1)
    optimizer = SGD(model.params, model.grads, lr=0.1)
    return Trainer(model, ArrayLoader(make_regression(n=40), batch_size=8), optimizer, driver="numpy", n_epochs=1,
                   progress_bar=None, callbacks=callbacks_of(optimizer))


def test_a_second_schedule_on_the_same_rates_is_refused_when_the_trainer_is_built():
    """Both would rewrite the rates after every step and the run would follow whichever came last."""
    with pytest.raises(ConfigurationError, match=r"WarmupSchedule\('linear', warmup_steps=2.*\) and "
                                                 r"LRSchedulerCallback\(Halving\) both set the learning rates .* "
                                                 r"keep one: drop the LRSchedulerCallback"):
        _trainer_with(lambda opt: [LRSchedulerCallback(Halving(opt)), WarmupSchedule(warmup_steps=2)])
    with pytest.raises(ConfigurationError, match=r"share callback_name='WarmupSchedule'"):
        _trainer_with(lambda opt: [WarmupSchedule(warmup_steps=2), WarmupSchedule("cosine")])

    class Renamed(WarmupSchedule):  # what that first message suggests: then the real conflict is named
        callback_name = "second_schedule"

    with pytest.raises(ConfigurationError, match=r"pass one WarmupSchedule \(it schedules every optimizer"):
        _trainer_with(lambda opt: [WarmupSchedule(warmup_steps=2), Renamed("cosine")])


def test_each_schedule_alone_still_trains():
    for callbacks_of in (lambda opt: [LRSchedulerCallback(Halving(opt))], lambda opt: [WarmupSchedule(warmup_steps=2)]):
        trainer = _trainer_with(callbacks_of)
        trainer.run()
        assert trainer.global_forward_batches == 5
