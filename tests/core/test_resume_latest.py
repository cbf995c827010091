"""``Trainer.run(resume_from="latest")``: one command line for the first start and every restart (numpy driver)."""

from __future__ import annotations

import logging
import os

import numpy as np
import pytest

from drivetrain import CallbackError, CheckpointCallback, ConfigurationError, Event, seed_everything

from ._callback_helpers import make_trainer, stop_after

N_EPOCHS = 2  # 26 batches


def _run(folder, *, stop_at=None, folders=None):
    """Train with periodic checkpoints (every 4 batches) into ``folder``, resuming from "latest"."""
    seed_everything(0)
    callbacks = [CheckpointCallback(f, every_n_batches=4, save_last=False) for f in (folders or [folder])]
    trainer = make_trainer(callbacks, n_epochs=N_EPOCHS)
    if stop_at is not None:
        stop_after(trainer, stop_at)
        with pytest.raises(CallbackError):
            trainer.run(resume_from="latest")
    else:
        trainer.run(resume_from="latest")
    return trainer


@pytest.fixture(scope="module")
def reference():
    seed_everything(0)
    trainer = make_trainer(None, n_epochs=N_EPOCHS)
    trainer.run()
    return trainer.model.params


def _assert_same(params, reference) -> None:
    for name in ("weight", "bias"):
        np.testing.assert_array_equal(params[name], reference[name])


def test_first_start_is_fresh_and_says_so(tmp_path, caplog) -> None:
    with caplog.at_level(logging.INFO, logger="drivetrain"):
        trainer = _run(tmp_path / "ckpt", stop_at=3)
    assert trainer.global_forward_batches == 3
    assert any("starting fresh" in r.getMessage() for r in caplog.records)


def test_crash_then_latest_resumes_sample_exactly(tmp_path, reference, caplog) -> None:
    folder = tmp_path / "ckpt"
    _run(folder, stop_at=10)  # checkpoints at 4 and 8; crashed after batch 10
    with caplog.at_level(logging.INFO, logger="drivetrain"):
        seed_everything(123)  # a different process state: everything must come from the checkpoint
        resumed = _run(folder)
    assert any("resuming from" in r.getMessage() and "step_00000008" in r.getMessage() for r in caplog.records)
    _assert_same(resumed.model.params, reference)
    assert resumed.global_forward_batches == 2 * 13


def test_newest_over_several_checkpoint_callbacks(tmp_path, reference) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    _run(a, stop_at=6)  # only `a` has a checkpoint: step 4
    _run(a, folders=[b], stop_at=14)  # `b` alone: fresh start, checkpoints at 4, 8, 12
    seen = []
    seed_everything(0)
    trainer = make_trainer([CheckpointCallback(f, every_n_batches=4, save_last=False) for f in (a, b)],
                           n_epochs=N_EPOCHS)
    trainer.add_callback_fn(Event.on_train_begin(), lambda t: seen.append(t.global_forward_batches))
    trainer.run(resume_from="latest")
    assert seen == [12]  # b's step 12 is newer than a's step 4
    _assert_same(trainer.model.params, reference)


def test_latest_without_checkpoint_callback_is_an_error(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    trainer = make_trainer(None, n_epochs=1)
    with pytest.raises(ConfigurationError, match=r"resume_from='latest'.*CheckpointCallback\(folder=") as info:
        trainer.run(resume_from="latest")
    assert "exists here" not in str(info.value)
    os.mkdir("latest")  # a literal folder named latest: the keyword wins, and the message says so
    with pytest.raises(ConfigurationError, match=r"keyword wins .*'\./latest'"):
        make_trainer(None, n_epochs=1).run(resume_from="latest")
