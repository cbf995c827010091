"""WarmupSchedule on jittor optimizers: per-group rates at known steps, and exact resume."""

from __future__ import annotations

import numpy as np
import pytest

from drivetrain import CallbackError, Event, Trainer, WarmupSchedule, seed_everything

from .conftest import Points, TinyNet, jt

pytestmark = pytest.mark.jittor

BASES = (0.02, 0.01)  # fc1's group has its own lr; fc2's group uses the optimizer's lr
STEPS = 2 * 8 // 2  # 64 samples, batch size 8, 2 epochs, accumulation_steps=2
WARMUP = 3


def linear(t: int) -> float:
    return t / WARMUP if t <= WARMUP else (STEPS - t + 1) / (STEPS - WARMUP)


def weights(model) -> dict[str, np.ndarray]:
    return {k: v.numpy().copy() for k, v in model.state_dict().items()}


def build(folder=None, stop=None):
    seed_everything(0)
    model = TinyNet()
    optimizer = jt.optim.Adam([{"params": model.fc1.parameters(), "lr": BASES[0]},
                               {"params": model.fc2.parameters()}], lr=BASES[1])
    trainer = Trainer(model, Points(64, batch_size=8, shuffle=True), optimizer, driver="jittor", device="cpu",
                      n_epochs=2, accumulation_steps=2, progress_bar=None,
                      callbacks=[WarmupSchedule("linear", warmup_steps=WARMUP)])
    rates = []
    trainer.add_callback_fn(Event.on_before_optimizers_step(),
                            lambda t, opts: rates.append([g.get("lr", opts[0].lr) for g in opts[0].param_groups]))
    if stop is not None:
        def save_and_stop(t) -> None:
            if t.global_forward_batches == stop:
                t.save_checkpoint(str(folder))
                raise RuntimeError("stopped on purpose")

        trainer.add_callback_fn(Event.on_train_batch_end(), save_and_stop)
    return trainer, model, rates


def test_every_param_group_follows_the_schedule() -> None:
    trainer, _, rates = build()
    assert trainer.driver.get_lrs() == [list(BASES)]
    trainer.run(num_eval_sanity_batch=0)
    assert len(rates) == STEPS
    for t in range(1, STEPS + 1):
        assert rates[t - 1] == pytest.approx([base * linear(t) for base in BASES], rel=1e-12), f"step {t}"
    assert trainer.driver.get_lrs() == [[0.0, 0.0]]


@pytest.mark.parametrize("stop", [5, 8])  # inside an accumulation cycle, at the end of epoch 0
def test_a_resumed_run_matches_an_unbroken_one_bit_for_bit(tmp_path, stop) -> None:
    trainer, model, ref_rates = build()
    trainer.run(num_eval_sanity_batch=0)
    reference = weights(model)
    first, _, _ = build(tmp_path / "ck", stop)
    with pytest.raises(CallbackError):
        first.run(num_eval_sanity_batch=0)
    resumed, rebuilt, rates = build()
    resumed.run(num_eval_sanity_batch=0, resume_from=str(tmp_path / "ck"))
    assert 0 < len(rates) < STEPS and rates == ref_rates[STEPS - len(rates):]
    for name, value in weights(rebuilt).items():
        np.testing.assert_array_equal(value, reference[name], err_msg=name)
