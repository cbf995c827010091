"""EarlyStopCallback and LRSchedulerCallback on the numpy driver, including resume."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from drivetrain import (
    CallbackError,
    CheckpointCallback,
    ConfigurationError,
    DrivetrainError,
    EarlyStopCallback,
    Event,
    LRSchedulerCallback,
    seed_everything,
)

from ._callback_helpers import BATCHES_PER_EPOCH, assert_same_params, from_table, make_trainer, stop_after

NAN = float("nan")

# ---------------------------------------------------------------- early stop


@pytest.mark.parametrize("kwargs, match", [
    (dict(patience=0), r"patience=0\) is not accepted; pass an int >= 1"),
    (dict(patience=2.0), r"patience=2.0\) is not accepted"),
    (dict(min_delta=-0.1), r"min_delta=-0.1\) is not accepted; pass a finite number >= 0"),
    (dict(min_delta=NAN), r"min_delta=nan\) is not accepted"),
    (dict(monitor=["acc"]), r"monitor=\['acc'\]\) is not accepted; pass a result name"),
    (dict(larger_better=1), r"larger_better=1\) is not accepted; pass True, False, or None"),
])
def test_early_stop_bad_arguments(kwargs, match):
    with pytest.raises(ConfigurationError, match=match):
        EarlyStopCallback(**kwargs)


def test_early_stop_needs_a_monitor_and_an_evaluation():
    with pytest.raises(DrivetrainError, match=r"early stopping needs a monitor, .*pass monitor='<result name>' to "
                                              r"EarlyStopCallback \(or to the Trainer\)"):
        make_trainer([EarlyStopCallback()], script=lambda s: 0.0)
    with pytest.raises(DrivetrainError, match=r"early stopping needs evaluation results.*pass metrics="):
        make_trainer([EarlyStopCallback(monitor="score")])


# Batch: 1     2     3     4     5     6     7     8
RISING = from_table({1: 10.0, 2: 10.3, 3: 10.5, 4: 11.0, 5: 11.2, 6: 11.5, 7: 11.4, 8: 12.0})


def test_an_improvement_must_beat_the_best_by_more_than_min_delta():
    # 10.5 and 11.5 beat the best by exactly 0.5: not more than min_delta, so no improvement.
    stop = EarlyStopCallback(monitor="score", patience=3, min_delta=0.5)
    trainer = make_trainer([stop], script=RISING, n_batches=8)
    trainer.run(num_eval_sanity_batch=0)
    assert trainer.global_forward_batches == 7
    assert (stop.best, stop.wait) == (11.0, 3)


def test_min_delta_zero_counts_any_improvement():
    stop = EarlyStopCallback(monitor="score", patience=1)
    trainer = make_trainer([stop], script=RISING, n_batches=6)
    trainer.run(num_eval_sanity_batch=0)
    assert trainer.global_forward_batches == 6 and stop.best == 11.5 and stop.wait == 0


def test_direction_and_monitor_come_from_the_trainer():
    stop = EarlyStopCallback(patience=2)
    trainer = make_trainer([stop], script=from_table({1: 5.0, 2: 4.0, 3: 4.0, 4: 4.5, 5: 1.0}), n_batches=6,
                           monitor="score", larger_better=False)
    ends = []
    trainer.add_callback_fn(Event.on_train_end(), lambda t: ends.append(t.global_forward_batches))
    trainer.run(num_eval_sanity_batch=0)
    assert ends == [4] and stop.best == 4.0


def test_larger_better_on_the_callback_wins_over_the_trainer():
    stop = EarlyStopCallback(monitor="score", larger_better=True, patience=1)
    trainer = make_trainer([stop], script=from_table({1: 1.0, 2: 0.5}), n_batches=4, larger_better=False)
    trainer.run(num_eval_sanity_batch=0)
    assert trainer.global_forward_batches == 2


def test_nan_is_never_an_improvement():
    stop = EarlyStopCallback(monitor="score", patience=2)
    trainer = make_trainer([stop], script=from_table({1: 1.0, 2: NAN, 3: NAN, 4: 2.0}), n_batches=4)
    trainer.run(num_eval_sanity_batch=0)
    assert trainer.global_forward_batches == 3 and stop.best == 1.0


def test_evaluate_after_an_early_stop_evaluates_and_stops_nothing():
    stop = EarlyStopCallback(monitor="score", patience=1)
    trainer = make_trainer([stop], script=from_table({1: 1.0, 2: 0.5}), n_batches=4)
    trainer.run(num_eval_sanity_batch=0)
    assert trainer.global_forward_batches == 2
    before = (stop.best, stop.wait)
    for _ in range(3):  # each would be an evaluation without improvement if it counted
        assert trainer.evaluate() == {"score#score": 0.5}
    assert (stop.best, stop.wait) == before


# Rises to batch 6, then flat: with patience 4 the run stops after batch 10.
PLATEAU = lambda step: float(min(step, 6))  # noqa: E731


def test_early_stop_state_survives_a_resume(tmp_path):
    reference = make_trainer([EarlyStopCallback(monitor="score", patience=4)], script=PLATEAU)
    reference.run(num_eval_sanity_batch=0)
    assert reference.global_forward_batches == 10

    def build():
        return make_trainer([EarlyStopCallback(monitor="score", patience=4), CheckpointCallback(tmp_path, every_n_batches=1)],
                            script=PLATEAU)

    first = build()
    stop_after(first, 9)  # the newest checkpoint (batch 8) holds two evaluations without improvement
    with pytest.raises(CallbackError):
        first.run(num_eval_sanity_batch=0)
    resumed = build()
    resumed.run(resume_from=tmp_path, num_eval_sanity_batch=0)
    assert resumed.global_forward_batches == 10
    assert (resumed.callbacks[0].best, resumed.callbacks[0].wait) == (6.0, 4)


# ------------------------------------------------------------- lr scheduler
class HalvingLR:
    """A numpy-side StepLR: lr = base * gamma ** (steps // step_size), on drivetrain_numpy.SGD."""

    def __init__(self, optimizer, step_size: int = 2, gamma: float = 0.5) -> None:
        self.optimizer = optimizer
        self.step_size = step_size
        self.gamma = gamma
        self.base_lr = optimizer.lr
        self.last_epoch = 0

    def step(self) -> None:
        self.last_epoch += 1
        self.optimizer.lr = self.base_lr * self.gamma ** (self.last_epoch // self.step_size)

    def state_dict(self) -> dict:
        return {"last_epoch": self.last_epoch, "base_lr": self.base_lr, "step_size": self.step_size,
                "gamma": self.gamma}

    def load_state_dict(self, state: dict) -> None:
        self.__dict__.update(state)


class PaddleStyleLR(HalvingLR):
    """paddle's LRScheduler restores with set_state_dict."""

    load_state_dict = None

    def set_state_dict(self, state: dict) -> None:
        self.__dict__.update(state)


def _scheduled_trainer(step_on, *, accumulation_steps=1, scheduler_cls=HalvingLR, callbacks_first=(), **kw):
    made = {}

    def callbacks(opt):
        made["opt"], made["scheduler"] = opt, scheduler_cls(opt)
        return [*callbacks_first, LRSchedulerCallback(made["scheduler"], step_on=step_on)]

    trainer = make_trainer(callbacks, accumulation_steps=accumulation_steps, lr=0.08, **kw)
    return trainer, made["opt"], made["scheduler"]


def _expected_lr(steps: int, step_size: int = 2) -> float:
    return 0.08 * 0.5 ** (steps // step_size)


def test_lr_scheduler_bad_arguments():
    with pytest.raises(ConfigurationError, match=r"step_on='step'\) is not accepted; pass 'batch' .* or 'epoch'"):
        LRSchedulerCallback(HalvingLR(SimpleNamespace(lr=0.1)), step_on="step")
    with pytest.raises(ConfigurationError, match=r"scheduler=0.1\) is not accepted: it has no step\(\) method"):
        LRSchedulerCallback(0.1)


def test_batch_schedule_follows_the_optimizer_steps_under_accumulation():
    trainer, opt, scheduler = _scheduled_trainer("batch", accumulation_steps=2, n_epochs=2)
    seen = []
    trainer.add_callback_fn(Event.on_train_batch_end(), lambda t: seen.append((opt.steps, scheduler.last_epoch, opt.lr)))
    trainer.run()
    # 13 batches per epoch, cycles of 2: the optimizer steps after batches 2, 4, ..., 12 and 13 (a short cycle).
    steps_per_epoch = [b // 2 + (b == BATCHES_PER_EPOCH) for b in range(1, BATCHES_PER_EPOCH + 1)]
    expected_steps = steps_per_epoch + [7 + s for s in steps_per_epoch]
    assert [s for s, _, _ in seen] == expected_steps
    assert all(last == steps for steps, last, _ in seen)
    assert [lr for _, _, lr in seen] == [_expected_lr(s) for s in expected_steps]


def test_epoch_schedule():
    trainer, opt, scheduler = _scheduled_trainer("epoch", n_epochs=4)
    begins = []
    trainer.add_callback_fn(Event.on_train_epoch_begin(), lambda t: begins.append(opt.lr))
    trainer.run()
    assert begins == [_expected_lr(e) for e in range(4)] == [0.08, 0.08, 0.04, 0.04]
    assert scheduler.last_epoch == 4


@pytest.mark.parametrize("step_on, scheduler_cls, stop, every", [
    ("batch", HalvingLR, 8, "batches"),  # resumed after batch 7: mid accumulation cycle
    ("batch", PaddleStyleLR, 14, "batches"),  # after batch 13: the end of epoch 0
    ("epoch", HalvingLR, 14, "epochs"),  # saved at the end of epoch 0, after the scheduler's epoch step
    ("epoch", HalvingLR, 27, "batches"),  # after batch 26: the end of epoch 1
])
def test_a_resumed_run_continues_the_schedule_exactly(step_on, scheduler_cls, stop, every, tmp_path):
    """The CheckpointCallback is listed before the scheduler on purpose: saves wait for the step to finish."""
    def build(folder=None):
        period = {"every_n_batches": stop - 1} if every == "batches" else {"every_n_epochs": 1}
        first = [CheckpointCallback(folder, save_last=False, **period)] if folder else ()
        trainer, opt, scheduler = _scheduled_trainer(step_on, accumulation_steps=3, scheduler_cls=scheduler_cls,
                                                     callbacks_first=first)
        lrs = []
        trainer.add_callback_fn(Event.on_train_batch_begin(), lambda t, b, i: lrs.append(opt.lr))
        return trainer, scheduler, lrs

    seed_everything(0)
    reference, ref_scheduler, ref_lrs = build()
    reference.run()

    seed_everything(0)
    first, _, _ = build(tmp_path)
    stop_after(first, stop)
    with pytest.raises(CallbackError):
        first.run()
    seed_everything(5)
    resumed, scheduler, lrs = build(tmp_path)
    resumed.run(resume_from=tmp_path)
    assert lrs == ref_lrs[len(ref_lrs) - len(lrs):]
    assert len(lrs) == 3 * BATCHES_PER_EPOCH - (stop - 1)  # resumed after the newest complete step, stop - 1
    assert scheduler.state_dict() == ref_scheduler.state_dict()
    assert_same_params(resumed, reference)


def test_scheduler_without_state_dict_cannot_be_checkpointed(tmp_path):
    class Bare:
        def step(self):
            pass

    trainer = make_trainer([LRSchedulerCallback(Bare())])
    with pytest.raises(ConfigurationError, match=r"Bare has no state_dict\(\), so a checkpoint could not resume"):
        trainer.save_checkpoint(tmp_path / "c")
