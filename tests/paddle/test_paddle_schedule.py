"""WarmupSchedule on paddle optimizers: one rate per optimizer, group multipliers kept, exact resume."""

from __future__ import annotations

import numpy as np
import paddle
import pytest

from drivetrain import (
    CallbackError,
    DriverError,
    Event,
    LRSchedulerCallback,
    Trainer,
    WarmupSchedule,
    seed_everything,
)

RATE = 0.02  # the optimizer's rate; fc2's param group steps at a quarter of it
STEPS = 3 * 13  # 100 samples, batch size 8: 13 batches per epoch, 3 epochs, a step per batch
WARMUP = 5


def linear(t: int) -> float:
    """The factor of optimizer step t (1-based): warmup over WARMUP steps, then linear decay to 0."""
    return t / WARMUP if t <= WARMUP else (STEPS - t + 1) / (STEPS - WARMUP)


class Table(paddle.io.Dataset):
    def __init__(self, n: int = 100) -> None:
        rng = np.random.default_rng(0)
        self.x = rng.standard_normal((n, 4)).astype(np.float32)
        self.y = (self.x[:, 0] > self.x[:, 1]).astype(np.int64)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict:
        return {"x": self.x[i], "y": self.y[i]}


def build(tiny_net_cls):
    seed_everything(0)
    model = tiny_net_cls()
    optimizer = paddle.optimizer.AdamW(learning_rate=RATE, parameters=[
        {"params": model.fc1.parameters()}, {"params": model.fc2.parameters(), "learning_rate": 0.25}])
    loader = paddle.io.DataLoader(Table(), batch_size=8, shuffle=True)
    trainer = Trainer(model, loader, optimizer, driver="paddle", n_epochs=3, progress_bar=None,
                      callbacks=[WarmupSchedule("linear", warmup_steps=WARMUP)])
    rates = []
    trainer.add_callback_fn(Event.on_before_optimizers_step(), lambda t, opts: rates.append(opts[0].get_lr()))
    return trainer, model, rates


def weights(model) -> dict[str, bytes]:
    return {k: v.numpy().tobytes() for k, v in model.state_dict().items()}


def test_the_rate_follows_the_schedule_and_groups_keep_their_multiplier(tiny_net_cls) -> None:
    trainer, _, rates = build(tiny_net_cls)
    assert trainer.driver.get_lrs() == [[RATE, RATE * 0.25]]
    trainer.run(num_eval_sanity_batch=0)
    assert len(rates) == STEPS
    for t in (1, 3, 5, 6, 20, STEPS):
        assert rates[t - 1] == pytest.approx(RATE * linear(t), rel=1e-12), f"step {t}"
    assert trainer.driver.get_lrs() == [[0.0, 0.0]]


@pytest.mark.parametrize("stop_at", [4, 13, 22])  # in the warmup, at the end of epoch 0, in the decay
def test_a_resumed_run_matches_an_unbroken_one_bit_for_bit(tiny_net_cls, tmp_path, stop_at) -> None:
    trainer, model, ref_rates = build(tiny_net_cls)
    trainer.run(num_eval_sanity_batch=0)
    reference = weights(model)

    first, _, _ = build(tiny_net_cls)
    folder = tmp_path / "ck"

    def save_and_stop(t) -> None:
        if t.global_forward_batches == stop_at:
            t.save_checkpoint(folder)
            raise RuntimeError("stopped on purpose")

    first.add_callback_fn(Event.on_train_batch_end(), save_and_stop)
    with pytest.raises(CallbackError):
        first.run(num_eval_sanity_batch=0)
    resumed, rebuilt, rates = build(tiny_net_cls)
    resumed.run(resume_from=folder, num_eval_sanity_batch=0)
    assert len(rates) == STEPS - stop_at and rates == ref_rates[stop_at:]
    assert weights(rebuilt) == reference


def test_rates_out_of_the_groups_ratio_are_refused(tiny_net_cls) -> None:
    trainer, _, _ = build(tiny_net_cls)
    with pytest.raises(DriverError, match=r"paddle keeps one learning rate per optimizer and each param group's "
                                          r"learning_rate is a fixed multiplier of it \(\[1.0, 0.25\]\)"):
        trainer.driver.set_lrs([[0.1, 0.1]])
    trainer.driver.set_lrs([[0.1, 0.025]])
    assert trainer.driver.get_lrs() == [[0.1, 0.025]]


def test_a_paddle_scheduler_as_learning_rate_is_refused_with_the_fix(tiny_net_cls) -> None:
    model = tiny_net_cls()
    scheduler = paddle.optimizer.lr.StepDecay(0.1, step_size=2)
    optimizer = paddle.optimizer.SGD(learning_rate=scheduler, parameters=model.parameters())
    with pytest.raises(CallbackError, match=r"takes its learning rate from a paddle StepDecay, which set_lrs cannot "
                                            r"override.*learning_rate=1e-3.*LRSchedulerCallback\(scheduler\)"):
        Trainer(model, paddle.io.DataLoader(Table(), batch_size=8), optimizer, driver="paddle", progress_bar=None,
                callbacks=[WarmupSchedule("cosine", warmup_ratio=0.1)])


def test_paddle_schedulers_still_work_through_lr_scheduler_callback(tiny_net_cls) -> None:
    model = tiny_net_cls()
    scheduler = paddle.optimizer.lr.StepDecay(0.1, step_size=2, gamma=0.5)
    optimizer = paddle.optimizer.SGD(learning_rate=scheduler, parameters=model.parameters())
    loader = paddle.io.DataLoader(Table(32), batch_size=8)
    trainer = Trainer(model, loader, optimizer, driver="paddle", n_epochs=1, progress_bar=None,
                      callbacks=[LRSchedulerCallback(scheduler)])
    trainer.run(num_eval_sanity_batch=0)
    assert trainer.driver.get_lrs() == [[pytest.approx(0.025)]]
