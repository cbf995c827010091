"""The step contract: the driver computes a batch's loss and gradients in one call (``Driver.forward_backward``).

A framework with ``loss.backward()`` keeps the default (forward, ``loss_fn``, the loss divided by the cycle's size,
backward); a framework that computes a loss and its gradients in one call (JAX) overrides the hook and declares
``Capabilities(separate_backward=False)``. Here such a driver is the numpy driver with its own fused hook: it must
train to the same numbers, receive each accumulation cycle's size and whether gradients are exchanged, and the
Trainer must refuse what cannot work on it (a callback that may change the loss between forward and backward, a
Trainer subclass overriding ``train_step``/``backward``) with a message whose fix works.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from drivetrain import Callback, ConfigurationError, DriverError, Event, Trainer
from drivetrain.backend import Driver
from drivetrain_numpy.driver import NumpyDriver

from .conftest import drivetrain_numpy, make_regression


class FusedNumpyDriver(NumpyDriver):
    """The numpy driver as a functional framework would be: gradients only inside ``forward_backward``."""

    name = "numpy_fused"
    capabilities = dataclasses.replace(NumpyDriver.capabilities, separate_backward=False)
    backward = Driver.backward  # no backward of a loss computed elsewhere

    def __init__(self, model, **options):
        super().__init__(model, **options)
        self.calls: list[tuple[int, bool]] = []

    def forward_backward(self, batch, step, *, cycle_size=1, sync=True, before_backward=None):
        assert before_backward is None, "a fused driver is never handed an event between loss and backward"
        self.calls.append((cycle_size, sync))
        outputs = step.call(batch)
        loss = step.loss(outputs)
        (loss / cycle_size if cycle_size > 1 else loss).backward()
        return outputs


def _setup(seed: int = 0):
    model = drivetrain_numpy.LinearModel(3, 1, seed=seed)
    opt = drivetrain_numpy.SGD(model.params, model.grads, lr=0.05)
    loader = drivetrain_numpy.ArrayLoader(make_regression(n=64), batch_size=8)  # 8 batches per epoch
    return model, opt, loader


def _train(driver_cls=None, **kwargs):
    model, opt, loader = _setup()
    driver = "numpy" if driver_cls is None else driver_cls(model)
    trainer = Trainer(model, loader, opt, driver=driver, n_epochs=2, progress_bar=None, **kwargs)
    trainer.run()
    return trainer, {k: v.copy() for k, v in model.params.items()}


@pytest.mark.parametrize("accumulation_steps", [1, 3])
def test_a_fused_driver_trains_to_the_same_numbers_as_the_default_path(accumulation_steps: int) -> None:
    _, expected = _train(accumulation_steps=accumulation_steps)
    trainer, got = _train(FusedNumpyDriver, accumulation_steps=accumulation_steps)
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name])
    if accumulation_steps == 1:
        assert trainer.driver.calls == [(1, True)] * 16
    else:  # 8 batches an epoch in cycles of 3, 3 and 2: the loss is divided by each cycle's size, synced at its end
        epoch = [(3, False), (3, False), (3, True), (3, False), (3, False), (3, True), (2, False), (2, True)]
        assert trainer.driver.calls == epoch * 2


def test_the_default_progress_and_records_read_the_loss_after_a_fused_call(tmp_path) -> None:
    trainer, _ = _train(FusedNumpyDriver, loggers=["jsonl"], run_dir=str(tmp_path), log_every_n_steps=4)
    losses = [row["train/loss"] for row in trainer.history["train"]]
    assert len(losses) == 4 and all(np.isfinite(losses)) and losses[-1] < losses[0]


class ScaleLoss(Callback):
    def on_before_backward(self, trainer, outputs):
        outputs["loss"] = outputs["loss"] * 0.0


class ReadLoss(Callback):
    changes_loss = False

    def __init__(self):
        self.seen = []

    def on_before_backward(self, trainer, outputs):
        self.seen.append(float(outputs["loss"]))


def test_a_callback_that_may_change_the_loss_is_refused_at_construction_naming_the_driver_and_the_event() -> None:
    model, opt, loader = _setup()
    with pytest.raises(ConfigurationError, match=r"callback ScaleLoss handles on_before_backward.*numpy_fused driver"
                                                 r".*changes_loss = False"):
        Trainer(model, loader, opt, driver=FusedNumpyDriver(model), callbacks=[ScaleLoss()], progress_bar=None)


def test_the_suggested_fix_works_a_reading_callback_runs_after_the_fused_call() -> None:
    reader = ReadLoss()
    trainer, expected = _train(FusedNumpyDriver, callbacks=[reader])
    assert len(reader.seen) == 16 and all(np.isfinite(reader.seen))
    _, plain = _train()
    for name in plain:
        np.testing.assert_array_equal(expected[name], plain[name])


def test_on_the_default_path_a_callback_still_changes_the_loss_before_the_backward() -> None:
    _, params = _train(callbacks=[ScaleLoss()])
    initial = drivetrain_numpy.LinearModel(3, 1, seed=0).params
    for name in initial:
        np.testing.assert_array_equal(params[name], initial[name])  # a zero loss: no parameter moved


def test_add_callback_fn_refuses_a_loss_handler_and_leaves_the_trainer_usable() -> None:
    model, opt, loader = _setup()
    trainer = Trainer(model, loader, opt, driver=FusedNumpyDriver(model), n_epochs=1, progress_bar=None)
    with pytest.raises(ConfigurationError, match="numpy_fused driver computes the loss and its gradients"):
        trainer.add_callback_fn(Event.on_before_backward(), lambda trainer, outputs: None)
    trainer.run()
    assert trainer.global_forward_batches == 8


def test_a_function_that_only_reads_the_loss_is_accepted_when_it_says_so_and_runs_after_the_fused_call() -> None:
    model, opt, loader = _setup()
    trainer = Trainer(model, loader, opt, driver=FusedNumpyDriver(model), n_epochs=1, progress_bar=None)
    losses: list[float] = []

    def record_loss(trainer, outputs):
        losses.append(float(outputs["loss"]))

    with pytest.raises(ConfigurationError, match=r"set changes_loss = False on its function \(fn.changes_loss"):
        trainer.add_callback_fn(Event.on_before_backward(every=2), record_loss)
    record_loss.changes_loss = False  # the fix the message names, also through a filter (every=2)
    trainer.add_callback_fn(Event.on_before_backward(every=2), record_loss)
    trainer.run()
    assert len(losses) == 4 and all(np.isfinite(losses))


class HabitTrainer(Trainer):
    """fastNLP's habit: override backward to add to what it does."""

    backward_calls = 0

    def backward(self, outputs):
        HabitTrainer.backward_calls += 1
        super().backward(outputs)


def test_a_subclass_overriding_backward_keeps_working_where_the_framework_has_a_separate_backward() -> None:
    model, opt, loader = _setup()
    HabitTrainer(model, loader, opt, driver="numpy", n_epochs=2, progress_bar=None, accumulation_steps=3).run()
    assert HabitTrainer.backward_calls == 16
    _, expected = _train(accumulation_steps=3)
    for name in expected:
        np.testing.assert_array_equal(model.params[name], expected[name])


def test_a_subclass_overriding_backward_is_refused_on_a_fused_driver_and_the_fix_works() -> None:
    model, opt, loader = _setup()
    with pytest.raises(ConfigurationError, match=r"HabitTrainer overrides Trainer.backward.*numpy_fused driver.*"
                                                 r"Override Trainer.forward_backward"):
        HabitTrainer(model, loader, opt, driver=FusedNumpyDriver(model), progress_bar=None)

    class FixedTrainer(Trainer):
        calls = 0

        def forward_backward(self, batch):
            FixedTrainer.calls += 1
            return super().forward_backward(batch)

    model, opt, loader = _setup()
    FixedTrainer(model, loader, opt, driver=FusedNumpyDriver(model), n_epochs=1, progress_bar=None).run()
    assert FixedTrainer.calls == 8


def test_a_batch_step_fn_with_a_separate_backward_gets_the_fix_on_a_fused_driver_and_the_fix_works() -> None:
    def two_calls(trainer, batch):
        trainer.backward(trainer.train_step(batch))
        trainer.step()
        trainer.zero_grad()

    model, opt, loader = _setup()
    trainer = Trainer(model, loader, opt, driver=FusedNumpyDriver(model), n_epochs=1, progress_bar=None,
                      batch_step_fn=two_calls)
    with pytest.raises(DriverError, match=r"call trainer.forward_backward\(batch\) in a batch_step_fn"):
        trainer.run()

    def fused(trainer, batch):
        trainer.forward_backward(batch)
        trainer.step()
        trainer.zero_grad()

    model, opt, loader = _setup()
    Trainer(model, loader, opt, driver=FusedNumpyDriver(model), n_epochs=2, progress_bar=None,
            batch_step_fn=fused).run()
    _, plain = _train()
    for name in plain:
        np.testing.assert_array_equal(model.params[name], plain[name])
