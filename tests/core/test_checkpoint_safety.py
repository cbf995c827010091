"""Checkpoints under attack and under stress: code smuggled into the files, a full disk, a read-only
folder, and damage of every kind. Loading never runs code from a checkpoint, every failure names
the file and the problem, and a failed load or save changes nothing.

(test_resume.py covers a flipped byte in training_state.safetensors, a truncated or missing
model.safetensors, a manifest of another driver or a newer format version; this file covers the rest.)
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import pickle
import shutil
import subprocess

import numpy as np
import pytest

from drivetrain import CheckpointError, Event, Trainer, seed_everything
from drivetrain._format.folder import TEMP_PREFIX, read_checkpoint
from drivetrain_numpy import SGD, ArrayLoader, LinearModel

from .conftest import make_regression

MODEL = "model.safetensors"
STATE_TENSORS = "training_state.safetensors"
STATE_JSON = "training_state.json"
PICKLE = "unsafe_pickled_state.pkl"
MANIFEST = "manifest.json"


def make_trainer(seed_model=0, in_features=3, **kwargs):
    model = LinearModel(in_features, 1, seed=seed_model, noise=0.3)
    loader = ArrayLoader(make_regression(n=50, in_features=in_features), batch_size=4, shuffle=True, seed=11)
    return Trainer(model, loader, SGD(model.params, model.grads, lr=0.05), driver="numpy", n_epochs=2,
                   accumulation_steps=3, progress_bar=None, **kwargs)


class Stop(Exception):
    pass


@pytest.fixture
def checkpoint(tmp_path):
    """A checkpoint taken inside an accumulation cycle (step 7): it carries gradients too."""
    seed_everything(0)
    trainer = make_trainer()

    def save_and_stop(t):
        if t.global_forward_batches == 7:
            t.save_checkpoint(tmp_path / "ckpts" / "step-7")
            raise Stop()

    trainer.add_callback_fn(Event.on_train_batch_end(), save_and_stop)
    with pytest.raises(Exception, match="Stop"):
        trainer.run()
    return tmp_path / "ckpts" / "step-7"


def snapshot(trainer):
    """Everything a failed load must leave alone."""
    return ({k: v.copy() for k, v in trainer.model.params.items()},
            {k: v.copy() for k, v in trainer.model.grads.items()},
            trainer.driver.optimizers[0].state_dict(), trainer.global_forward_batches, trainer.cur_epoch_idx,
            np.random.get_state()[1].copy())


def assert_unchanged(trainer, before):
    params, grads, opt, gfb, epoch, rng = before
    for k in params:
        np.testing.assert_array_equal(trainer.model.params[k], params[k])
        np.testing.assert_array_equal(trainer.model.grads[k], grads[k])
    assert trainer.driver.optimizers[0].state_dict() == opt
    assert (trainer.global_forward_batches, trainer.cur_epoch_idx) == (gfb, epoch)
    np.testing.assert_array_equal(np.random.get_state()[1], rng)


def replace_file(ckpt, name, data: bytes, **manifest_changes):
    """Put ``data`` into the checkpoint as ``name`` and fix the manifest's size and sha256 for it."""
    (ckpt / name).write_bytes(data)
    manifest = json.loads((ckpt / MANIFEST).read_text())
    manifest["files"][name] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    manifest.update(manifest_changes)
    (ckpt / MANIFEST).write_text(json.dumps(manifest))


# ---------------------------------------------------------------- pickles that would run code
class Payload:
    """Unpickling this creates the folder ``sentinel``: proof that code from the checkpoint ran."""

    def __init__(self, sentinel):
        self.sentinel = str(sentinel)

    def __reduce__(self):
        return (os.mkdir, (self.sentinel,))


def evil_bytes(sentinel) -> bytes:
    return pickle.dumps({"Counter": Payload(sentinel)})


def test_pickled_state_is_refused_without_allow_pickle(checkpoint, tmp_path):
    sentinel = tmp_path / "code-ran"
    replace_file(checkpoint, PICKLE, evil_bytes(sentinel), pickle=True)
    trainer = make_trainer(seed_model=3)
    before = snapshot(trainer)
    with pytest.raises(CheckpointError, match=r"contains pickled state \(unsafe_pickled_state.pkl\); loading it "
                                              r"could run code.*allow_pickle=True"):
        trainer.load_checkpoint(checkpoint)
    assert_unchanged(trainer, before)
    with pytest.raises(CheckpointError, match="contains pickled state"):
        make_trainer().run(resume_from=checkpoint.parent)
    with pytest.raises(CheckpointError, match="contains pickled state"):
        make_trainer().run(resume_from=checkpoint)
    assert not sentinel.exists()


def test_pickle_file_is_refused_even_when_the_manifest_says_no_pickle(checkpoint, tmp_path):
    sentinel = tmp_path / "code-ran"
    replace_file(checkpoint, PICKLE, evil_bytes(sentinel), pickle=False)
    with pytest.raises(CheckpointError, match="contains pickled state"):
        make_trainer().load_checkpoint(checkpoint)
    assert not sentinel.exists()


def test_allow_pickle_is_the_only_way_to_the_pickle(checkpoint, tmp_path):
    """The opt-in works (and is what runs the payload): pickle is taken only when asked for by name."""
    sentinel = tmp_path / "code-ran"
    replace_file(checkpoint, PICKLE, evil_bytes(sentinel), pickle=True)
    trainer = make_trainer()
    with contextlib.suppress(Exception):  # what the payload returns is no callback state
        trainer.load_checkpoint(checkpoint, allow_pickle=True)
    assert sentinel.exists()


@pytest.mark.parametrize("name", [MODEL, STATE_TENSORS])
def test_pickle_in_place_of_a_tensor_file_is_not_unpickled(checkpoint, tmp_path, name):
    sentinel = tmp_path / "code-ran"
    replace_file(checkpoint, name, evil_bytes(sentinel))
    trainer = make_trainer(seed_model=3)
    before = snapshot(trainer)
    with pytest.raises(CheckpointError, match=rf"{name} is not a readable safetensors file"):
        trainer.load_checkpoint(checkpoint)
    assert_unchanged(trainer, before)
    for allow_pickle in (False, True):  # allow_pickle is about unsafe_pickled_state.pkl only
        with pytest.raises(CheckpointError, match=rf"{name} is not a readable safetensors file"):
            make_trainer().load_checkpoint(checkpoint, allow_pickle=allow_pickle)
    with pytest.raises(CheckpointError, match=rf"{name} is not a readable safetensors file"):
        make_trainer().run(resume_from=checkpoint.parent)
    assert not sentinel.exists()


def test_pickle_in_place_of_the_json_state_is_not_unpickled(checkpoint, tmp_path):
    sentinel = tmp_path / "code-ran"
    replace_file(checkpoint, STATE_JSON, evil_bytes(sentinel))
    trainer = make_trainer(seed_model=3)
    before = snapshot(trainer)
    for allow_pickle in (False, True):
        with pytest.raises(CheckpointError, match=rf"{STATE_JSON} is damaged: not valid JSON"):
            trainer.load_checkpoint(checkpoint, allow_pickle=allow_pickle)
    assert_unchanged(trainer, before)
    with pytest.raises(CheckpointError, match=rf"{STATE_JSON} is damaged: not valid JSON"):
        make_trainer().run(resume_from=checkpoint)
    assert not sentinel.exists()


# ------------------------------------------------------------------------------- a full disk
def _mount(*args) -> str | None:
    """Run ``mount``; return why it failed, or None."""
    if shutil.which("mount") is None:
        return "no mount command"
    proc = subprocess.run(["mount", *args], capture_output=True, text=True, timeout=30)
    return None if proc.returncode == 0 else (proc.stderr.strip() or f"mount exited with {proc.returncode}")


def _umount(path) -> None:
    subprocess.run(["umount", str(path)], capture_output=True, timeout=30)


def fill_with_checkpoints(folder):
    """Train, saving after every batch into ``folder`` until a save fails; return (saved paths, the error)."""
    seed_everything(0)
    trainer = make_trainer()
    saved: list[str] = []
    errors: list[OSError] = []

    def save_until_full(t):
        try:
            saved.append(t.save_checkpoint(folder / f"step-{t.global_forward_batches:03d}"))
        except OSError as exc:
            errors.append(exc)
            raise Stop() from exc

    trainer.add_callback_fn(Event.on_train_batch_end(), save_until_full)
    with pytest.raises(Exception, match="Stop"):
        trainer.run()
    assert len(saved) >= 1, "the first checkpoint should fit on the tiny disk"
    assert len(errors) == 1
    return saved, errors[0]


@pytest.fixture
def tiny_disk(tmp_path):
    """A 64 KiB tmpfs, where a mount is permitted (root in a container usually is)."""
    where = tmp_path / "tiny"
    where.mkdir()
    why = _mount("-t", "tmpfs", "-o", "size=64k", "tmpfs", str(where))
    if why is not None:
        pytest.skip(f"cannot mount a tmpfs to fill ({why})")
    try:
        yield where
    finally:
        _umount(where)


def real_entries(folder):
    return sorted(e for e in os.listdir(folder) if not e.startswith(TEMP_PREFIX))


def test_disk_full_gives_enospc_and_keeps_the_previous_checkpoint(tiny_disk):
    saved, error = fill_with_checkpoints(tiny_disk)
    assert error.errno == errno.ENOSPC, error
    assert "No space left on device" in str(error)
    # Every checkpoint under a real name is complete; the failed one left nothing behind, not even its temp folder.
    assert real_entries(tiny_disk) == [os.path.basename(p) for p in saved]
    for path in saved:
        read_checkpoint(path)
    assert [e for e in os.listdir(tiny_disk) if e.startswith(TEMP_PREFIX)] == []
    # ... and training can go on from the last one that fitted.
    resumed = make_trainer()
    resumed.run(resume_from=tiny_disk)
    assert resumed.global_forward_batches == 26


def test_disk_full_error_names_the_checkpoint(tiny_disk):
    saved, error = fill_with_checkpoints(tiny_disk)
    failed = f"step-{int(os.path.basename(saved[-1])[5:]) + 1:03d}"
    assert failed in str(error), str(error)


def test_disk_full_when_replacing_a_checkpoint_keeps_the_old_one(tiny_disk):
    seed_everything(0)
    small = make_trainer()
    small.save_checkpoint(tiny_disk / "latest")
    before = read_checkpoint(tiny_disk / "latest").files
    big = make_trainer(in_features=6000)  # 24 KB of weights: two of these do not fit in 64 KiB
    with pytest.raises(OSError) as info:
        for _ in range(8):
            big.save_checkpoint(tiny_disk / "latest")
    assert info.value.errno == errno.ENOSPC
    after = read_checkpoint(tiny_disk / "latest")  # the folder under the real name is whole
    assert set(after.files) == set(before)
    assert real_entries(tiny_disk) == ["latest"]


# ------------------------------------------------------------------------ a read-only folder
@contextlib.contextmanager
def read_only(folder, how):
    """Make ``folder`` unwritable: chmod (not for root), chattr +i (immutable), or a read-only bind mount."""
    if how == "chmod":
        if os.geteuid() == 0:
            pytest.skip("running as root: permission bits do not stop root (the chattr and ro-bind cases run)")
        os.chmod(folder, 0o500)
        try:
            yield
        finally:
            os.chmod(folder, 0o700)
    elif how == "chattr":
        proc = subprocess.run(["chattr", "+i", str(folder)], capture_output=True, text=True, timeout=30) \
            if shutil.which("chattr") else None
        if proc is None or proc.returncode != 0:
            pytest.skip(f"chattr +i is not available here ({proc.stderr.strip() if proc else 'no chattr'})")
        try:
            yield
        finally:
            subprocess.run(["chattr", "-i", str(folder)], capture_output=True, timeout=30)
    else:
        why = _mount("--bind", str(folder), str(folder))
        if why is not None:
            pytest.skip(f"cannot bind-mount ({why})")
        try:
            why = _mount("-o", "remount,bind,ro", str(folder))
            if why is not None:
                pytest.skip(f"cannot remount read-only ({why})")
            yield
        finally:
            _umount(folder)


@pytest.mark.parametrize("how", ["chmod", "chattr", "ro-bind"])
def test_unwritable_folder_gives_a_clear_error_and_keeps_the_previous_checkpoint(checkpoint, how):
    folder = checkpoint.parent
    trainer = make_trainer()
    with read_only(folder, how):
        for target in (folder / "step-8", checkpoint):  # a new checkpoint, and replacing one
            with pytest.raises(OSError) as info:
                trainer.save_checkpoint(target)
            assert info.value.errno in (errno.EACCES, errno.EPERM, errno.EROFS), info.value
            assert str(folder) in str(info.value), "the error names the folder it could not write"
        assert real_entries(folder) == ["step-7"]
        read_checkpoint(checkpoint)
        # Reading needs no write access: a resume from a read-only folder works.
        resumed = make_trainer()
        resumed.load_checkpoint(checkpoint)
        assert resumed.global_forward_batches == 7


# --------------------------------------------------------------------- damage of every kind
def flip_byte(path, offset):
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def check_refused(ckpt, match):
    """The damage is reported by load_checkpoint and by run(resume_from=folder), and nothing is applied."""
    trainer = make_trainer(seed_model=4)
    before = snapshot(trainer)
    with pytest.raises(CheckpointError, match=match):
        trainer.load_checkpoint(ckpt)
    assert_unchanged(trainer, before)
    trainer = make_trainer(seed_model=4)
    with pytest.raises(CheckpointError, match=match):
        trainer.run(resume_from=ckpt)
    assert trainer.global_forward_batches == 0


@pytest.mark.parametrize("name", [MODEL, STATE_JSON])
@pytest.mark.parametrize("where", ["first", "middle"])
def test_flipped_byte(checkpoint, name, where):
    path = checkpoint / name
    flip_byte(path, 0 if where == "first" else path.stat().st_size // 2)
    check_refused(checkpoint, rf"{name} is damaged: its sha256 does not match the manifest")


@pytest.mark.parametrize("name", [STATE_TENSORS, STATE_JSON])
def test_truncated_file(checkpoint, name):
    path = checkpoint / name
    path.write_bytes(path.read_bytes()[:-1])
    check_refused(checkpoint, rf"{name} is damaged: \d+ bytes where the manifest says \d+ \(truncated\?\)")


def test_file_grown(checkpoint):
    path = checkpoint / STATE_JSON
    path.write_bytes(path.read_bytes() + b" ")
    check_refused(checkpoint, rf"{STATE_JSON} is damaged: \d+ bytes where the manifest says")


@pytest.mark.parametrize("name", [STATE_TENSORS, STATE_JSON])
def test_missing_file(checkpoint, name):
    (checkpoint / name).unlink()
    check_refused(checkpoint, rf"{name} is missing; the checkpoint .* is incomplete")


@pytest.mark.parametrize("name", [MODEL, STATE_TENSORS, STATE_JSON])
def test_file_left_out_of_the_manifest(checkpoint, name):
    manifest = json.loads((checkpoint / MANIFEST).read_text())
    del manifest["files"][name]
    (checkpoint / MANIFEST).write_text(json.dumps(manifest))
    check_refused(checkpoint, rf"the manifest lists no {name}")


def test_missing_manifest(checkpoint):
    (checkpoint / MANIFEST).unlink()
    trainer = make_trainer(seed_model=4)
    before = snapshot(trainer)
    with pytest.raises(CheckpointError, match=r"is not a checkpoint: it has no manifest.json"):
        trainer.load_checkpoint(checkpoint)
    assert_unchanged(trainer, before)


@pytest.mark.parametrize("garbage", [b"", b"\x00\xff garbage", b'{"format_version": 1, "files": {', b"[1, 2, 3]",
                                     b'{"format_version": 1}', b'{"format_version": 1, "files": []}'],
                         ids=["empty", "binary", "cut-off", "a-list", "no-files", "files-not-a-table"])
def test_garbage_manifest(checkpoint, garbage):
    (checkpoint / MANIFEST).write_bytes(garbage)
    check_refused(checkpoint, r"manifest.json is damaged: (not valid JSON|it lacks the 'files' table)")


def test_flipped_byte_in_the_manifest(checkpoint):
    """A flip inside a recorded checksum shows up as a mismatch of that file (the manifest has no own checksum)."""
    text = (checkpoint / MANIFEST).read_text()
    manifest = json.loads(text)
    digest = manifest["files"][MODEL]["sha256"]
    flipped = ("0" if digest[10] != "0" else "1").join([digest[:10], digest[11:]])
    (checkpoint / MANIFEST).write_text(text.replace(digest, flipped))
    check_refused(checkpoint, rf"{MODEL} is damaged: its sha256 does not match the manifest")


@pytest.mark.parametrize("version", [2, "1", None])
def test_manifest_format_version_not_understood(checkpoint, version):
    manifest = json.loads((checkpoint / MANIFEST).read_text())
    manifest["format_version"] = version
    (checkpoint / MANIFEST).write_text(json.dumps(manifest))
    check_refused(checkpoint, rf"format version {version!r}.*reads format versions up to 1")


def test_manifest_of_another_driver_via_run(checkpoint):
    manifest = json.loads((checkpoint / MANIFEST).read_text())
    (checkpoint / MANIFEST).write_text(json.dumps(dict(manifest, driver="paddle")))
    check_refused(checkpoint, r"written by driver 'paddle' but this trainer uses 'numpy'")


def test_file_name_that_leaves_the_folder(checkpoint, tmp_path):
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"secret")
    manifest = json.loads((checkpoint / MANIFEST).read_text())
    manifest["files"]["../../outside.bin"] = {"sha256": hashlib.sha256(b"secret").hexdigest(), "size": 6}
    (checkpoint / MANIFEST).write_text(json.dumps(manifest))
    check_refused(checkpoint, r"manifest.json is damaged: file name '\.\./\.\./outside\.bin' is not plain")


def test_tensor_reference_missing_from_the_tensor_file(checkpoint):
    skeleton = json.loads((checkpoint / STATE_JSON).read_bytes())
    skeleton["callbacks"]["Ghost"] = {"w": {"__tensor__": "callbacks/Ghost/w"}}
    replace_file(checkpoint, STATE_JSON, json.dumps(skeleton).encode())
    check_refused(checkpoint, r"training_state.json: checkpoint state refers to tensor 'callbacks/Ghost/w'")


def test_saved_model_of_another_shape(tmp_path):
    make_trainer(in_features=5).save_checkpoint(tmp_path / "other")
    check_refused(tmp_path / "other", r"shapes differ \(name, saved, model\): \[\('weight', \(5, 1\), \(3, 1\)\)\]")


def test_optimizer_mismatch_changes_nothing(checkpoint):
    model = LinearModel(3, 1, seed=4, noise=0.3)
    loader = ArrayLoader(make_regression(n=50), batch_size=4, shuffle=True, seed=11)
    two = [SGD(model.params, model.grads, lr=0.05), SGD(model.params, model.grads, lr=0.05)]
    trainer = Trainer(model, loader, two, driver="numpy", n_epochs=2, accumulation_steps=3, progress_bar=None)
    before = snapshot(trainer)
    with pytest.raises(Exception, match=r"holds 1 optimizer state\(s\) but the trainer has 2"):
        trainer.load_checkpoint(checkpoint)
    assert_unchanged(trainer, before)
