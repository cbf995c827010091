"""Checkpoints and sample-exact resume on the numpy driver (in-process; kill -9 tests are separate)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from drivetrain import Callback, CallbackError, CheckpointError, Event, Trainer, seed_everything
from drivetrain_numpy import SGD, ArrayLoader, LinearModel

from .conftest import make_regression


class Stop(Exception):
    pass


class Counter(Callback):
    """A stateful callback: its count must survive a resume."""

    def __init__(self):
        self.batches = 0

    def on_train_batch_end(self, trainer):
        self.batches += 1

    def on_save_checkpoint(self, trainer):
        return {"batches": self.batches}

    def on_load_checkpoint(self, trainer, states):
        self.batches = states["batches"]


def make_trainer(n_epochs=3, accumulation_steps=3, seed_model=0, **kwargs):
    model = LinearModel(3, 1, seed=seed_model, noise=0.3)
    loader = ArrayLoader(make_regression(n=50), batch_size=4, shuffle=True, seed=11)
    kwargs.setdefault("callbacks", [Counter()])
    return Trainer(model, loader, SGD(model.params, model.grads, lr=0.05), driver="numpy", n_epochs=n_epochs,
                   accumulation_steps=accumulation_steps, progress_bar=None, **kwargs)


def uninterrupted():
    seed_everything(0)
    trainer = make_trainer()
    trainer.run()
    return trainer


def run_until(step, folder):
    """Train, checkpointing after every batch, and stop hard after `step` batches."""
    seed_everything(0)
    trainer = make_trainer()

    def save_and_maybe_stop(t):
        t.save_checkpoint(os.path.join(folder, f"step-{t.global_forward_batches:05d}"))
        if t.global_forward_batches == step:
            raise Stop()

    trainer.add_callback_fn(Event.on_train_batch_end(), save_and_maybe_stop)
    with pytest.raises(CallbackError):
        trainer.run()


@pytest.mark.parametrize("step", [1, 2, 3, 7, 12, 13, 14, 26, 38])
def test_resume_is_bit_exact(step, tmp_path):
    # 13 batches per epoch, accumulation 3: step 7 is mid-cycle, 13 ends an epoch, 26 ends epoch 2.
    reference = uninterrupted()
    run_until(step, tmp_path)
    seed_everything(123)  # a different process state: everything must come from the checkpoint
    resumed = make_trainer(seed_model=5)
    resumed.run(resume_from=tmp_path)
    for name in ("weight", "bias"):
        np.testing.assert_array_equal(resumed.model.params[name], reference.model.params[name])
    assert resumed.global_forward_batches == reference.global_forward_batches == 39
    assert resumed.callbacks[0].batches == 39


def test_resume_from_parent_takes_newest_and_removes_temp_folders(tmp_path):
    run_until(5, tmp_path)
    leftover = tmp_path / ".tmp-step-00006-123-abcd"
    leftover.mkdir()
    (leftover / "model.safetensors").write_bytes(b"half written")
    trainer = make_trainer()
    seen = []
    trainer.add_callback_fn(Event.on_train_begin(), lambda t: seen.append(t.global_forward_batches))
    trainer.run(resume_from=tmp_path)
    assert seen == [5]
    assert not leftover.exists()


def test_manifest_records_versions_position_and_checksums(tmp_path):
    run_until(4, tmp_path)
    manifest = json.loads((tmp_path / "step-00004" / "manifest.json").read_text())
    assert manifest["format_version"] == 1
    assert manifest["driver"] == "numpy"
    assert manifest["trainer"]["global_forward_batches"] == 4
    assert manifest["trainer"]["batches_done"] == 4 and manifest["trainer"]["epoch"] == 0
    assert manifest["trainer"]["consumed_samples"] == 16
    assert set(manifest["files"]) == {"model.safetensors", "training_state.safetensors", "training_state.json"}
    assert all(len(rec["sha256"]) == 64 for rec in manifest["files"].values())


def test_resume_training_false_loads_only_weights(tmp_path):
    run_until(20, tmp_path)
    trainer = make_trainer()
    begins = []
    trainer.add_callback_fn(Event.on_train_begin(), lambda t: begins.append(t.global_forward_batches))
    trainer.run(resume_from=tmp_path / "step-00020", resume_training=False)
    assert begins == [0] and trainer.global_forward_batches == 39


def test_damaged_file_is_named_and_nothing_is_loaded(tmp_path):
    run_until(6, tmp_path)
    ckpt = tmp_path / "step-00006"
    data = bytearray((ckpt / "training_state.safetensors").read_bytes())
    data[-1] ^= 0xFF
    (ckpt / "training_state.safetensors").write_bytes(bytes(data))
    trainer = make_trainer(seed_model=9)
    before = {k: v.copy() for k, v in trainer.model.params.items()}
    with pytest.raises(CheckpointError, match=r"training_state.safetensors is damaged: its sha256 does not match"):
        trainer.load_checkpoint(ckpt)
    for k in before:
        np.testing.assert_array_equal(trainer.model.params[k], before[k])


def test_checkpoint_for_another_driver_or_newer_format_is_refused(tmp_path):
    run_until(2, tmp_path)
    ckpt = tmp_path / "step-00002"
    manifest = json.loads((ckpt / "manifest.json").read_text())
    (ckpt / "manifest.json").write_text(json.dumps(dict(manifest, driver="torch")))
    with pytest.raises(CheckpointError, match=r"written by driver 'torch' but this trainer uses 'numpy'"):
        make_trainer().load_checkpoint(ckpt)
    (ckpt / "manifest.json").write_text(json.dumps(dict(manifest, format_version=99)))
    with pytest.raises(CheckpointError, match=r"format version 99.*reads format versions up to 1. Upgrade drivetrain"):
        make_trainer().load_checkpoint(ckpt)


def test_missing_or_truncated_file(tmp_path):
    run_until(2, tmp_path)
    ckpt = tmp_path / "step-00002"
    data = (ckpt / "model.safetensors").read_bytes()
    (ckpt / "model.safetensors").write_bytes(data[:-3])
    with pytest.raises(CheckpointError, match=r"model.safetensors is damaged: \d+ bytes where the manifest says"):
        make_trainer().load_checkpoint(ckpt)
    (ckpt / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"model.safetensors is missing"):
        make_trainer().load_checkpoint(ckpt)


def test_no_checkpoint_in_folder(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="holds no complete training checkpoint"):
        make_trainer().run(resume_from=tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        make_trainer().run(resume_from=tmp_path / "nowhere")


def test_callback_state_that_is_not_plain_data_needs_allow_pickle(tmp_path):
    from drivetrain import StateEncodingError

    class Odd(Callback):
        def on_save_checkpoint(self, trainer):
            return {"when": object()}

    trainer = make_trainer(callbacks=None)
    trainer.callback_manager.add_callback(Odd())
    with pytest.raises(StateEncodingError, match=r"callback 'Odd'.*cannot be stored without pickle"):
        trainer.save_checkpoint(tmp_path / "c")
    assert not (tmp_path / "c").exists() and list(tmp_path.iterdir()) == []


def test_evaluation_does_not_shift_the_training_random_stream(tmp_path):
    from drivetrain import Accuracy

    data = make_regression(n=50)
    dev = ArrayLoader({"x": data["x"], "target": (data["target"] > 0).astype(np.int64).ravel()}, batch_size=10)

    def noisy_eval(evaluator, batch):
        np.random.standard_normal(100)  # evaluation code drawing random numbers

    results = []
    for with_eval in (False, True):
        seed_everything(0)
        model = LinearModel(3, 1, noise=0.3)
        loader = ArrayLoader(data, batch_size=4, shuffle=True)
        kwargs = dict(metrics={"acc": Accuracy()}, evaluate_dataloaders=dev, evaluate_every=5,
                      evaluate_batch_step_fn=noisy_eval) if with_eval else {}
        Trainer(model, loader, SGD(model.params, model.grads), driver="numpy", n_epochs=2, progress_bar=None,
                **kwargs).run()
        results.append(model.params["weight"].copy())
    np.testing.assert_array_equal(results[0], results[1])


def test_explicit_load_checkpoint_then_run_keeps_a_cycle_in_progress(tmp_path):
    reference = uninterrupted()
    run_until(7, tmp_path)  # mid accumulation cycle: gradients are part of the state
    resumed = make_trainer(seed_model=5)
    resumed.load_checkpoint(tmp_path / "step-00007")
    resumed.run()
    np.testing.assert_array_equal(resumed.model.params["weight"], reference.model.params["weight"])


def _record_indices(trainer, seen):
    def record(t, batch, indices):
        seen.append((t.cur_epoch_idx, indices, batch["x"].copy()))
    trainer.add_callback_fn(Event.on_train_batch_begin(), record)


def test_on_train_batch_begin_gets_the_batchs_dataset_indices(tmp_path):
    """indices name the very samples of the batch, cover each epoch once, and continue after a resume."""
    data = make_regression(n=50)
    seed_everything(0)
    trainer = make_trainer(n_epochs=2, callbacks=[])
    seen = []
    _record_indices(trainer, seen)
    trainer.run()
    for epoch in (0, 1):
        batches = [(indices, x) for e, indices, x in seen if e == epoch]
        assert sorted(i for indices, _ in batches for i in indices) == list(range(50))
        for indices, x in batches:
            np.testing.assert_array_equal(x, data["x"][indices])
    first_epoch = [indices for e, indices, _ in seen if e == 0]
    assert first_epoch != sorted(first_epoch), "the loader shuffles, so the indices are not in order"

    run_until(5, str(tmp_path))
    resumed = make_trainer(n_epochs=2, callbacks=[])
    after = []
    _record_indices(resumed, after)
    resumed.run(resume_from=str(tmp_path))
    assert [indices for _, indices, _ in after] == [indices for _, indices, _ in seen][5:]
