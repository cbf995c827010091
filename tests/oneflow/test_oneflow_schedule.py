"""WarmupSchedule on oneflow optimizers: per-group rates at known steps, and exact resume."""

from __future__ import annotations

import math

import numpy as np
import pytest

from drivetrain import CallbackError, Event, Trainer, WarmupSchedule, seed_everything

from .conftest import flow, tiny_net

BASES = (0.03, 0.01)  # fc1's and fc2's param groups
STEPS = 3 * 5  # 100 samples, batch size 8: 13 batches per epoch in cycles of 3 (3,3,3,3,1): 5 steps
WARMUP = 2  # ceil(0.1 * 15)


def cosine(t: int) -> float:
    if t <= WARMUP:
        return t / WARMUP
    return 0.1 + 0.9 * (1 + math.cos(math.pi * (t - 1 - WARMUP) / (STEPS - WARMUP))) / 2


class Table(flow.utils.data.Dataset):
    def __init__(self, n: int = 100) -> None:
        rng = np.random.default_rng(0)
        self.x = rng.standard_normal((n, 4)).astype(np.float32)
        self.y = (self.x[:, 0] > self.x[:, 1]).astype(np.int64)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict:
        return {"x": self.x[i], "y": self.y[i]}


def build():
    seed_everything(0)
    model = tiny_net()
    optimizer = flow.optim.AdamW([{"params": model.fc1.parameters(), "lr": BASES[0]},
                                  {"params": model.fc2.parameters(), "lr": BASES[1]}])
    loader = flow.utils.data.DataLoader(Table(), batch_size=8, shuffle=True)
    trainer = Trainer(model, loader, optimizer, driver="oneflow", n_epochs=3, accumulation_steps=3, progress_bar=None,
                      callbacks=[WarmupSchedule("cosine", warmup_ratio=0.1, min_lr_ratio=0.1)])
    rates = []
    trainer.add_callback_fn(Event.on_before_optimizers_step(),
                            lambda t, opts: rates.append([g["lr"] for g in opts[0].param_groups]))
    return trainer, model, rates


def weights(model) -> dict[str, bytes]:
    return {k: v.numpy().tobytes() for k, v in model.state_dict().items()}


def test_every_param_group_follows_the_schedule() -> None:
    trainer, _, rates = build()
    assert trainer.driver.get_lrs() == [list(BASES)]
    trainer.run(num_eval_sanity_batch=0)
    assert len(rates) == STEPS
    for t in range(1, STEPS + 1):
        assert rates[t - 1] == pytest.approx([base * cosine(t) for base in BASES], rel=1e-12), f"step {t}"
    assert trainer.driver.get_lrs() == [pytest.approx([0.1 * base for base in BASES], rel=1e-12)]


@pytest.mark.parametrize("stop_at", [5, 13, 20])  # mid-cycle in the warmup, end of epoch 0, mid-cycle later
def test_a_resumed_run_matches_an_unbroken_one_bit_for_bit(tmp_path, stop_at) -> None:
    trainer, model, ref_rates = build()
    trainer.run(num_eval_sanity_batch=0)
    reference = weights(model)

    first, _, _ = build()
    folder = tmp_path / "ck"

    def save_and_stop(t) -> None:
        if t.global_forward_batches == stop_at:
            t.save_checkpoint(folder)
            raise RuntimeError("stopped on purpose")

    first.add_callback_fn(Event.on_train_batch_end(), save_and_stop)
    with pytest.raises(CallbackError):
        first.run(num_eval_sanity_batch=0)
    resumed, rebuilt, rates = build()
    resumed.run(resume_from=folder, num_eval_sanity_batch=0)
    assert 0 < len(rates) < STEPS and rates == ref_rates[STEPS - len(rates):]
    assert weights(rebuilt) == reference
