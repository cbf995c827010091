"""The training loop reads nothing from the device per batch: losses and gradient norms are read when shown or logged.

On CPU the reads are counted by wrapping the tensor methods that copy a value to the host;
on a GPU the same run goes under ``torch.cuda.set_sync_debug_mode``.
"""

from __future__ import annotations

import io
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from drivetrain import Event, RawTextProgress, Trainer

from .conftest import TinyNet

BATCHES = 40
EVERY = 10
READERS = ("item", "numpy", "tolist", "__float__", "__int__", "__bool__", "__index__")


def make_trainer(device: str = "cpu", **kwargs) -> Trainer:
    torch.manual_seed(0)
    model = TinyNet()
    data = TensorDataset(torch.randn(BATCHES * 8, 4), torch.randint(0, 2, (BATCHES * 8,)))
    loader = DataLoader(data, batch_size=8, shuffle=True)
    return Trainer(model, loader, torch.optim.SGD(model.parameters(), lr=0.1), driver="torch", device=device,
                   n_epochs=1, input_mapping=lambda batch: {"x": batch[0], "y": batch[1]}, **kwargs)


def count_reads_while_training(trainer: Trainer, monkeypatch) -> list[str]:
    """Every host read of a tensor between the first batch and the end of training, by method name."""
    reads: list[str] = []
    training = [False]
    for name in READERS:
        original = getattr(torch.Tensor, name)

        def counting(self, *args, _name=name, _original=original, **kwargs):
            if training[0]:
                reads.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counting)
    trainer.add_callback_fn(Event.on_train_batch_begin(), lambda t, batch, indices: training.__setitem__(0, True))
    trainer.add_callback_fn(Event.on_train_end(), lambda t: training.__setitem__(0, False))
    return reads


def test_without_display_or_record_a_run_reads_nothing_from_the_device(monkeypatch) -> None:
    trainer = make_trainer(progress_bar=None, grad_clip=1.0)
    reads = count_reads_while_training(trainer, monkeypatch)
    trainer.run()
    assert trainer.global_forward_batches == BATCHES
    assert reads == []


def test_progress_and_records_read_once_per_refresh_or_window_not_per_batch(tmp_path, monkeypatch) -> None:
    out = io.StringIO()
    trainer = make_trainer(progress_bar=RawTextProgress(print_every=EVERY, file=out), grad_clip=1.0,
                           loggers=["csv"], log_every_n_steps=EVERY, run_dir=tmp_path)
    reads = count_reads_while_training(trainer, monkeypatch)
    trainer.run()
    windows = BATCHES // EVERY
    # per window: the stacked losses and the stacked gradient norms; per refresh: the last loss
    assert reads.count("numpy") == 3 * windows, reads
    assert len(reads) == 3 * windows, reads
    assert trainer.history["train"][-1]["train/grad_norm"] > 0
    assert "loss" in out.getvalue()


@pytest.mark.gpu
def test_a_cuda_run_makes_no_synchronising_call_outside_display_and_records(tmp_path) -> None:
    for precision in ("fp32", "bf16"):
        trainer = make_trainer("cuda", progress_bar=None, precision=precision)
        torch.cuda.set_sync_debug_mode("error")
        try:
            trainer.run()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    trainer = make_trainer("cuda", progress_bar=RawTextProgress(print_every=EVERY, file=io.StringIO()),
                           loggers=["csv"], log_every_n_steps=EVERY, run_dir=tmp_path, grad_clip=1.0)
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer.run()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    synchronising = [w for w in caught if "synchroniz" in str(w.message)]
    assert len(synchronising) <= 4 * (BATCHES // EVERY) + 4, [str(w.message) for w in synchronising]
