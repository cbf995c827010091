"""A damaged newest checkpoint (a bit flip, a truncated file, a missing one, whole or sharded):
``resume_from="latest"`` says which one and why, resumes from the newest intact one and ends as an
unbroken run; naming the damaged one refuses with the checksum error (issue 39, part 3)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from drivetrain import CheckpointCallback, CheckpointError, Trainer
from drivetrain_numpy import SGD, ArrayLoader, LinearModel

from .conftest import make_regression
from .test_sharded_checkpoint import ShardingNumpyDriver


def _trainer(folder: Path, sharded: bool, n_batches: int = -1) -> Trainer:
    model = LinearModel(3, 1)
    optimizer = SGD(model.params, model.grads, lr=0.05)
    driver = ShardingNumpyDriver(model) if sharded else "numpy"
    return Trainer(model, ArrayLoader(make_regression(n=64, seed=2), batch_size=8, shuffle=True), optimizer,
                   driver=driver, n_epochs=2, n_batches=n_batches, progress_bar=None,
                   callbacks=[CheckpointCallback(folder, every_n_batches=4, save_last=False)])


def _weights_file(checkpoint: Path, sharded: bool) -> Path:
    return checkpoint / ("shards-00000-of-00001.safetensors" if sharded else "model.safetensors")


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-7])


def _remove(path: Path) -> None:
    os.remove(path)


@pytest.mark.parametrize("sharded", [False, True], ids=["whole", "sharded"])
@pytest.mark.parametrize(("damage", "why"), [(_flip, "its sha256 does not match"), (_truncate, "truncated"),
                                             (_remove, "is missing")], ids=["bit-flip", "truncated", "missing"])
def test_latest_skips_a_damaged_newest_checkpoint_and_resumes_exactly(tmp_path, sharded, damage, why) -> None:
    unbroken = _trainer(tmp_path / "unbroken", sharded)
    unbroken.run()
    expected = {k: v.copy() for k, v in unbroken.driver.model.params.items()}

    folder = tmp_path / "ckpt"
    _trainer(folder, sharded, n_batches=12).run()  # checkpoints at steps 4, 8, 12
    names = sorted(os.listdir(folder))
    assert [n.split("-")[0] for n in names] == ["step_00000004", "step_00000008", "step_00000012"]
    newest = folder / names[-1]
    damage(_weights_file(newest, sharded))

    named = _trainer(folder, sharded)
    with pytest.raises(CheckpointError, match=why):
        named.run(resume_from=str(newest))

    resumed = _trainer(folder, sharded)
    with pytest.warns(RuntimeWarning, match=rf"skipping damaged checkpoint.*{names[-1]} \(.*{why}.*\)\. Resuming "
                                            rf"from the newest intact one, .*{names[1]}"):
        resumed.run(resume_from="latest")
    assert resumed.global_forward_batches == 16
    for name, value in expected.items():
        np.testing.assert_array_equal(resumed.driver.model.params[name], value)
    assert _reads_intact(newest)  # training on re-wrote the step the damaged checkpoint held


def _reads_intact(newest: Path) -> bool:
    from drivetrain._format import read_checkpoint

    return read_checkpoint(str(newest)).folder == str(newest)


def test_when_every_checkpoint_is_damaged_latest_says_so_and_starts_fresh(tmp_path) -> None:
    folder = tmp_path / "ckpt"
    _trainer(folder, False, n_batches=8).run()
    for name in os.listdir(folder):
        _flip(_weights_file(folder / name, False))
    fresh = _trainer(folder, False)
    with pytest.warns(RuntimeWarning, match="every training checkpoint there is damaged"):
        fresh.run(resume_from="latest")
    assert fresh.global_forward_batches == 16
