"""``CheckpointCallback(background=True)`` on torch, one process (issue 39, part 5): AdamW's moments and the weights
change in place at every step while the worker writes, yet every file holds the state of its step (the same
bytes as a foreground save) and the resume is bit-exact. The writer is slowed so that training overlaps it."""

from __future__ import annotations

import os
import time

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from drivetrain import CallbackError, CheckpointCallback, EarlyStopException, Event, Trainer
from drivetrain._format import folder as folder_module
from drivetrain._format import read_checkpoint

pytestmark = pytest.mark.torch


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Dropout(0.1),
                                        torch.nn.Linear(32, 1))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> dict:
        return {"loss": torch.nn.functional.mse_loss(self.body(x), y)}


def _trainer(folder=None, *, background: bool = True, stop_at: int | None = None, seed: int = 0) -> Trainer:
    torch.manual_seed(seed)
    model = Net()
    generator = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(96, 8, generator=generator), torch.randn(96, 1, generator=generator))
    callbacks = [] if folder is None else [CheckpointCallback(folder, every_n_batches=4, keep_last_n=2,
                                                              background=background, save_last=False)]
    trainer = Trainer(model, DataLoader(data, batch_size=8, shuffle=True), torch.optim.AdamW(model.parameters(), 1e-2),
                      driver="torch", device="cpu", n_epochs=2, accumulation_steps=2, progress_bar=None,
                      callbacks=callbacks)
    if stop_at is not None:
        def stop(t: Trainer) -> None:
            if t.global_forward_batches == stop_at:
                raise EarlyStopException("stopped on purpose")

        trainer.add_callback_fn(Event.on_train_batch_end(), stop)
    return trainer


@pytest.fixture
def slow_writes(monkeypatch):
    original = folder_module.write_files

    def slow(folder, tmp, files):
        time.sleep(0.05)
        return original(folder, tmp, files)

    monkeypatch.setattr(folder_module, "write_files", slow)


def test_background_saves_hold_the_foreground_bytes_and_resume_bit_exactly(tmp_path, slow_writes) -> None:
    straight = _trainer()
    straight.run()
    for mode in ("fg", "bg"):
        _trainer(tmp_path / mode / "ckpt", background=mode == "bg", stop_at=10).run()
    names = sorted(os.listdir(tmp_path / "fg" / "ckpt"))
    assert [n for n in names if n.startswith("step_")] == ["step_00000004-epoch_0-batch_4",
                                                           "step_00000008-epoch_0-batch_8"]
    for name in (n for n in names if n.startswith("step_")):
        fg = read_checkpoint(str(tmp_path / "fg" / "ckpt" / name))
        bg = read_checkpoint(str(tmp_path / "bg" / "ckpt" / name))
        assert fg.files == bg.files, name
    resumed = _trainer(tmp_path / "bg" / "ckpt", seed=5)
    resumed.run(resume_from=tmp_path / "bg" / "ckpt")
    for (name, a), b in zip(straight.model.state_dict().items(), resumed.model.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def test_a_failed_background_write_is_raised_and_the_previous_checkpoint_kept(tmp_path, monkeypatch) -> None:
    original = folder_module.write_files

    def failing(folder, tmp, files):
        if os.path.basename(folder).startswith("step_00000008"):
            raise OSError(28, "No space left on device (injected)")
        return original(folder, tmp, files)

    monkeypatch.setattr(folder_module, "write_files", failing)
    trainer = _trainer(tmp_path)
    with pytest.raises(CallbackError) as raised:
        trainer.run()
    assert isinstance(raised.value.__cause__, OSError) and "injected" in str(raised.value.__cause__)
    assert 8 < trainer.global_forward_batches <= 12
    assert sorted(n for n in os.listdir(tmp_path) if not n.startswith(".drivetrain")) == \
        ["step_00000004-epoch_0-batch_4"]
    read_checkpoint(str(tmp_path / "step_00000004-epoch_0-batch_4"))
