"""Shared pieces of the built-in callback tests: a trainer factory, a scripted metric, a hard stop."""

from __future__ import annotations

import os

import numpy as np

from drivetrain import Event, Metric, Trainer
from drivetrain_numpy import SGD, ArrayLoader, LinearModel

from .conftest import make_regression

BATCHES_PER_EPOCH = 13  # 50 samples, batch size 4


class Stop(Exception):
    """Raised by a test handler to kill a run after a given batch."""


class Scripted(Metric):
    """``{"score": script(step)}`` where step is the trainer's global batch count: the same after a resume."""

    result_names = ("score",)

    def __init__(self, script) -> None:
        super().__init__()
        self.register_element("seen", 0.0)
        self.script = script
        self.trainer = None

    def update(self, pred) -> None:
        self.seen += 1

    def get_metric(self) -> dict[str, float]:
        return {"score": float(self.script(self.trainer.global_forward_batches))}


def from_table(table: dict[int, float], default: float = 0.0):
    return lambda step: table.get(step, default)


def make_trainer(callbacks=None, *, n_epochs=3, accumulation_steps=1, seed_model=0, script=None, lr=0.05,
                 **kwargs) -> Trainer:
    """The regression problem of test_resume: 13 batches per epoch, shuffled, noisy inputs.

    With ``script`` the trainer evaluates a :class:`Scripted` metric (``evaluate_every`` defaults to 1).
    ``callbacks`` may be a function of the optimizer (to build a scheduler on it).
    """
    model = LinearModel(3, 1, seed=seed_model, noise=0.3)
    optimizer = SGD(model.params, model.grads, lr=lr)
    if callable(callbacks):
        callbacks = callbacks(optimizer)
    data = make_regression(n=50)
    loader = ArrayLoader(data, batch_size=4, shuffle=True, seed=11)
    metric = None
    if script is not None:
        metric = Scripted(script)
        kwargs.setdefault("evaluate_every", 1)
        kwargs.update(metrics={"score": metric}, evaluate_dataloaders=ArrayLoader(data, batch_size=25))
    trainer = Trainer(model, loader, optimizer, driver="numpy", n_epochs=n_epochs,
                      accumulation_steps=accumulation_steps, callbacks=callbacks, progress_bar=None, **kwargs)
    if metric is not None:
        metric.trainer = trainer
    return trainer


def stop_after(trainer: Trainer, step: int) -> None:
    """Make ``trainer`` raise :class:`Stop` once batch ``step`` has ended (after every callback saw it)."""

    def maybe_stop(t: Trainer) -> None:
        if t.global_forward_batches == step:
            raise Stop()

    trainer.add_callback_fn(Event.on_train_batch_end(), maybe_stop)


def listing(folder) -> list[str]:
    """What a checkpoint folder holds, without the lock a running trainer keeps there (_format/lock.py)."""
    return sorted(n for n in os.listdir(folder) if n != ".drivetrain-run.lock") if os.path.isdir(folder) else []


def params(trainer: Trainer) -> dict[str, np.ndarray]:
    return {k: v.copy() for k, v in trainer.model.params.items()}


def assert_same_params(a: Trainer, b: Trainer) -> None:
    for name in a.model.params:
        np.testing.assert_array_equal(a.model.params[name], b.model.params[name])
