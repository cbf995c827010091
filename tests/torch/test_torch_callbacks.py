"""The built-in callbacks with torch: StepLR through LRSchedulerCallback, checkpoints and resume."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader, Dataset  # noqa: E402

from drivetrain import CallbackError, CheckpointCallback, Event, LRSchedulerCallback, Trainer  # noqa: E402

BATCHES = 10  # 40 samples, batch size 4


class Stop(Exception):
    pass


class Pairs(Dataset):
    """Dict samples ``{"x", "y"}`` for the TinyNet of conftest."""

    def __init__(self, n: int = 40) -> None:
        gen = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 4, generator=gen)
        self.y = (self.x[:, 0] + self.x[:, 1] > 0).long()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict:
        return {"x": self.x[i], "y": self.y[i]}


def _build(tiny_net_cls, step_on, *, folder=None, stop=None, accumulation_steps=2, n_epochs=3):
    torch.manual_seed(0)
    model = tiny_net_cls()
    opt = torch.optim.SGD(model.parameters(), lr=0.4)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    callbacks = [LRSchedulerCallback(scheduler, step_on=step_on)]
    if folder is not None:
        callbacks.insert(0, CheckpointCallback(folder, every_n_batches=5, save_last=False))
    loader = DataLoader(Pairs(), batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(1))
    trainer = Trainer(model, loader, opt, driver="torch", device="cpu", n_epochs=n_epochs, callbacks=callbacks,
                      accumulation_steps=accumulation_steps, progress_bar=None)
    lrs = []
    trainer.add_callback_fn(Event.on_train_batch_begin(), lambda t, b, i: lrs.append(opt.param_groups[0]["lr"]))
    if stop is not None:
        def maybe_stop(t):
            if t.global_forward_batches == stop:
                raise Stop()

        trainer.add_callback_fn(Event.on_train_batch_end(), maybe_stop)
    return trainer, opt, scheduler, lrs


def test_steplr_steps_with_the_optimizer(tiny_net_cls):
    trainer, opt, scheduler, lrs = _build(tiny_net_cls, "batch", n_epochs=2)
    trainer.run()
    # accumulation 2 over 10 batches: 5 optimizer steps per epoch, lr halves every 3 steps
    steps_before = [b // 2 for b in range(BATCHES)] + [5 + b // 2 for b in range(BATCHES)]
    assert lrs == [0.4 * 0.5 ** (s // 3) for s in steps_before]
    assert scheduler.last_epoch == 10


def test_steplr_per_epoch(tiny_net_cls):
    trainer, opt, scheduler, lrs = _build(tiny_net_cls, "epoch", accumulation_steps=1, n_epochs=4)
    trainer.run()
    assert lrs[::BATCHES] == [0.4, 0.4, 0.4, 0.2]
    assert scheduler.last_epoch == 4


@pytest.mark.parametrize("step_on", ["batch", "epoch"])
def test_resumed_run_continues_the_schedule(tiny_net_cls, step_on, tmp_path):
    reference, _, ref_scheduler, ref_lrs = _build(tiny_net_cls, step_on)
    reference.run()
    first, _, _, _ = _build(tiny_net_cls, step_on, folder=tmp_path, stop=13)
    with pytest.raises(CallbackError):
        first.run()
    resumed, _, scheduler, lrs = _build(tiny_net_cls, step_on, folder=tmp_path)
    resumed.run(resume_from=tmp_path)  # the newest checkpoint is that of batch 10
    assert lrs == ref_lrs[BATCHES:]
    assert scheduler.state_dict() == ref_scheduler.state_dict()
    for (name, p), q in zip(resumed.model.named_parameters(), reference.model.parameters(), strict=True):
        assert torch.equal(p, q), name
