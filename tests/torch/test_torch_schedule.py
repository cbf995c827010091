"""WarmupSchedule on torch optimizers: the rate of every param group at known steps, and exact resume."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from drivetrain import CallbackError, CheckpointCallback, Event, LRSchedulerCallback, Trainer, WarmupSchedule

BASES = (0.02, 0.005)  # fc1's and fc2's rates: two param groups
N_BATCHES = 12  # 96 samples, batch size 8, per epoch
STEPS = 2 * N_BATCHES // 2  # 2 epochs, accumulation_steps=2
WARMUP = 3  # ceil(0.2 * 12)


def cosine(t: int) -> float:
    """The rate factor of optimizer step t (1-based): linear warmup over WARMUP steps, then half a cosine."""
    if t <= WARMUP:
        return t / WARMUP
    return (1 + math.cos(math.pi * (t - 1 - WARMUP) / (STEPS - WARMUP))) / 2


class Stop(Exception):
    pass


def build(tiny_net_cls, folder=None, every=None, stop=None):
    torch.manual_seed(0)
    model = tiny_net_cls()
    optimizer = torch.optim.AdamW([{"params": model.fc1.parameters(), "lr": BASES[0]},
                                   {"params": model.fc2.parameters(), "lr": BASES[1]}], weight_decay=0.01)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(96, 4, generator=gen)
    loader = DataLoader(TensorDataset(x, (x[:, 0] > x[:, 1]).long()), batch_size=8, shuffle=True,
                        generator=torch.Generator().manual_seed(2))
    callbacks = [CheckpointCallback(folder, every_n_batches=every, save_last=False)] if folder else []
    trainer = Trainer(model, loader, optimizer, driver="torch", device="cpu", n_epochs=2, accumulation_steps=2,
                      input_mapping=lambda batch: {"x": batch[0], "y": batch[1]}, progress_bar=None,
                      callbacks=[*callbacks, WarmupSchedule("cosine", warmup_ratio=0.2)])
    lrs = []
    trainer.add_callback_fn(Event.on_before_optimizers_step(),
                            lambda t, opts: lrs.append([g["lr"] for g in opts[0].param_groups]))
    if stop is not None:
        def halt(t):
            if t.global_forward_batches == stop:
                raise Stop()

        trainer.add_callback_fn(Event.on_train_batch_end(), halt)
    return trainer, lrs


def test_every_param_group_follows_the_schedule(tiny_net_cls) -> None:
    trainer, lrs = build(tiny_net_cls)
    trainer.run()
    assert len(lrs) == STEPS
    for t in (1, 2, 3, 4, 7, 12):
        assert lrs[t - 1] == pytest.approx([base * cosine(t) for base in BASES], rel=1e-12), f"step {t}"
    assert trainer.driver.get_lrs() == [[0.0, 0.0]]  # the decay is complete after the last step


@pytest.mark.parametrize("stop", [6, 14])  # resumed after batch 5 (inside a cycle) and after batch 13 (epoch 1)
def test_a_resumed_run_matches_an_unbroken_one_bit_for_bit(tiny_net_cls, tmp_path, stop) -> None:
    reference, ref_lrs = build(tiny_net_cls)
    reference.run()
    first, _ = build(tiny_net_cls, tmp_path, stop - 1, stop)
    with pytest.raises(CallbackError):
        first.run()
    resumed, lrs = build(tiny_net_cls, tmp_path, stop - 1)
    resumed.run(resume_from=tmp_path)
    assert 0 < len(lrs) < len(ref_lrs) and lrs == ref_lrs[len(ref_lrs) - len(lrs):]
    for (name, a), b in zip(resumed.model.state_dict().items(), reference.model.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def test_a_tensor_learning_rate_is_set_in_place(tiny_net_cls) -> None:
    model = tiny_net_cls()
    optimizer = torch.optim.Adam(model.parameters(), lr=torch.tensor(0.01))
    loader = [{"x": torch.randn(4, 4), "y": torch.tensor([0, 1, 0, 1])}] * 4
    trainer = Trainer(model, loader, optimizer, driver="torch", device="cpu", n_epochs=1, progress_bar=None,
                      callbacks=[WarmupSchedule("linear", warmup_steps=2)])
    rate = optimizer.param_groups[0]["lr"]
    seen = []
    trainer.add_callback_fn(Event.on_before_optimizers_step(), lambda t, opts: seen.append(float(rate)))
    trainer.run()
    assert optimizer.param_groups[0]["lr"] is rate
    assert seen == pytest.approx([0.005, 0.01, 0.01, 0.005])


def test_torch_schedulers_still_work_through_lr_scheduler_callback(tiny_net_cls) -> None:
    model = tiny_net_cls()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    loader = [{"x": torch.randn(4, 4), "y": torch.tensor([0, 1, 0, 1])}] * 4
    trainer = Trainer(model, loader, optimizer, driver="torch", device="cpu", n_epochs=1, progress_bar=None,
                      callbacks=[LRSchedulerCallback(scheduler)])
    trainer.run()
    assert trainer.driver.get_lrs() == [[pytest.approx(0.025)]]
