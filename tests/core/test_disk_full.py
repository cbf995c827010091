"""A save that meets a full disk (ENOSPC, on a real small tmpfs): the previous checkpoint stays intact and
loadable, the partial files are removed, the error names the folder, the bytes needed and the bytes free,
and training does not go on without checkpoints (issue 39, part 2). The sharded case (one rank's disk full)
is in the torch FSDP process tests (``save-fails``)."""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from drivetrain import CallbackError, CheckpointCallback, Trainer
from drivetrain_numpy import SGD, ArrayLoader, LinearModel


@pytest.fixture
def small_disk(tmp_path):
    """A 256 KiB tmpfs (root only: skipped elsewhere, with the reason)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _trainer(callbacks=()) -> Trainer:
    model = LinearModel(64, 64)  # ~16 KiB of weights: a checkpoint of a few tens of KiB
    return Trainer(model, ArrayLoader({"x": np.ones((32, 64), np.float32), "target": np.ones((32, 64), np.float32)},
                                      batch_size=8), SGD(model.params, model.grads, lr=0.01), driver="numpy",
                   n_epochs=1, progress_bar=None, callbacks=list(callbacks))


def _fill(disk: Path, leave: int) -> None:
    """Fill ``disk`` up to ``leave`` free bytes."""
    free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
    with open(disk / "filler", "wb") as f:
        f.write(b"\0" * max(free - leave, 0))


def test_a_full_disk_keeps_the_previous_checkpoint_and_says_how_much_is_missing(small_disk) -> None:
    trainer = _trainer()
    trainer.run()
    folder = small_disk / "ckpt"
    trainer.save_checkpoint(folder)
    before = {k: v.copy() for k, v in trainer.driver.model.params.items()}
    for value in trainer.driver.model.params.values():
        value += 1.0  # a different state to save
    _fill(small_disk, leave=8 << 10)
    with pytest.raises(OSError) as raised:
        trainer.save_checkpoint(folder)
    assert raised.value.errno == errno.ENOSPC
    message = str(raised.value)
    assert f"could not write checkpoint {folder}" in message and "the checkpoint needs about" in message
    assert "free on that filesystem" in message and "previous checkpoint under this name" in message
    assert sorted(os.listdir(small_disk)) == ["ckpt", "filler"]  # no partial folder left behind

    fresh = _trainer()
    fresh.load_checkpoint(folder)
    for name, value in before.items():
        np.testing.assert_array_equal(fresh.driver.model.params[name], value)


def test_training_stops_when_its_checkpoint_cannot_be_written(small_disk) -> None:
    _fill(small_disk, leave=8 << 10)
    trainer = _trainer([CheckpointCallback(small_disk / "ckpt", every_n_batches=2)])
    with pytest.raises(CallbackError) as raised:
        trainer.run()
    assert isinstance(raised.value.__cause__, OSError) and raised.value.__cause__.errno == errno.ENOSPC
    assert trainer.global_forward_batches == 2  # it did not train on without its checkpoint
