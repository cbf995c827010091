"""CheckpointCallback(background=True) on the numpy driver (issue 39, part 5): the loop waits only for the copy of
the state, a worker thread writes the files. Bit-exact resume, at most one save in flight, errors that surface
in the loop with the previous checkpoint intact, and the end of a run (or a failed run) waiting for the write.
The writer is slowed down here so that training really goes on while it writes."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

from drivetrain import CallbackError, CheckpointCallback, ConfigurationError, Trainer, seed_everything
from drivetrain._checkpoint.background import HostBuffers, host_copy
from drivetrain._format import folder as folder_module
from drivetrain._format import list_checkpoints, read_checkpoint
from drivetrain_numpy import SGD, ArrayLoader, LinearModel

from ._callback_helpers import Stop, assert_same_params, from_table, listing, make_trainer, stop_after
from ._kill9 import CHECKPOINT_KWARGS_ENV, Delays, kill_rounds
from .conftest import make_regression
from .test_sharded_checkpoint import ShardingNumpyDriver

TOTAL = 39  # 3 epochs of 13 batches


class Writes:
    """Wraps the file writer of checkpoint folders: slows it down, counts writes in flight, fails on demand."""

    def __init__(self, delay: float = 0.02, fail_folder: str | None = None) -> None:
        self.delay, self.fail_folder = delay, fail_folder
        self.active = self.most = 0
        self.threads: set[str] = set()
        self.lock = threading.Lock()
        self.original = folder_module.write_files

    def __call__(self, folder, tmp, files):
        with self.lock:
            self.active += 1
            self.most = max(self.most, self.active)
            self.threads.add(threading.current_thread().name)
        try:
            time.sleep(self.delay)
            if self.fail_folder is not None and os.path.basename(folder) == self.fail_folder:
                raise OSError(28, f"could not write checkpoint {folder} (injected): No space left on device")
            return self.original(folder, tmp, files)
        finally:
            with self.lock:
                self.active -= 1


@pytest.fixture
def writes(monkeypatch):
    spy = Writes()
    monkeypatch.setattr(folder_module, "write_files", spy)
    return spy


def _save_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("drivetrain-save-")]


def test_bad_arguments_say_what_to_do(tmp_path) -> None:
    with pytest.raises(ConfigurationError, match=r"background='yes'\) is not accepted; pass True or False"):
        CheckpointCallback(tmp_path, every_n_batches=2, background="yes")
    with pytest.raises(ConfigurationError, match=r"background=True\) writes resumable checkpoints .* use "
                                                  r"save_object='trainer' or drop background"):
        CheckpointCallback(tmp_path, every_n_batches=2, background=True, save_object="model")


def test_host_copies_own_their_bytes_and_reuse_the_memory_of_the_previous_save() -> None:
    weights = np.arange(6, dtype=np.float32)
    files = {"model": [("w", "F32", (6,), weights.data)], "state.json": b"{}"}
    buffers = HostBuffers()
    first = host_copy(files, buffers)
    weights += 1  # the next optimizer step, in place
    assert np.array_equal(np.frombuffer(first["model"][0][3], np.float32), np.arange(6))
    second = host_copy(files, buffers)  # the first save is written: its memory is taken again
    assert np.array_equal(np.frombuffer(second["model"][0][3], np.float32), np.arange(6) + 1)
    assert np.frombuffer(second["model"][0][3], np.uint8).ctypes.data == \
        np.frombuffer(first["model"][0][3], np.uint8).ctypes.data
    assert second["state.json"] is files["state.json"]


def test_background_checkpoints_hold_the_same_bytes_as_foreground_ones(tmp_path, writes) -> None:
    """Training goes on while the files are written, yet each file holds the state of its step: the copy."""
    for mode in ("fg", "bg"):
        seed_everything(0)
        # one folder name: it is part of the callback's name, saved in its state
        make_trainer([CheckpointCallback(tmp_path / mode / "ckpt", every_n_batches=5, background=mode == "bg")]).run()
    fg_folder, bg_folder = tmp_path / "fg" / "ckpt", tmp_path / "bg" / "ckpt"
    names = listing(fg_folder)
    assert names == listing(bg_folder) and len(names) == TOTAL // 5 + 1  # 7 periodic and last
    for name in names:
        fg, bg = read_checkpoint(str(fg_folder / name)), read_checkpoint(str(bg_folder / name))
        assert fg.files == bg.files, name
    assert writes.most == 1 and any(t.startswith("drivetrain-save-") for t in writes.threads)


@pytest.mark.parametrize("step", [6, 13, 20])
def test_resume_from_a_background_save_is_bit_exact(step, tmp_path, writes) -> None:
    seed_everything(0)
    reference = make_trainer()
    reference.run()
    seed_everything(0)
    broken = make_trainer([CheckpointCallback(tmp_path, every_n_batches=3, background=True, keep_last_n=2)],
                          accumulation_steps=2)
    stop_after(broken, step)
    with pytest.raises(CallbackError):
        broken.run()
    assert not _save_threads()  # the failed run waited for the save in flight
    # rotated only after each commit; a save made due by the last batch is not written (the run failed)
    assert len([n for n in listing(tmp_path) if n.startswith("step_")]) == min(2, (step - 1) // 3)
    seed_everything(7)
    resumed = make_trainer([CheckpointCallback(tmp_path, every_n_batches=3, background=True, keep_last_n=2)],
                           seed_model=5, accumulation_steps=2)
    resumed.run(resume_from=tmp_path)
    seed_everything(0)
    straight = make_trainer(accumulation_steps=2)
    straight.run()
    assert_same_params(resumed, straight)
    assert resumed.global_forward_batches == TOTAL and reference.global_forward_batches == TOTAL


def test_at_most_one_save_is_in_flight_and_the_end_waits_for_it(tmp_path, writes) -> None:
    writes.delay = 0.2  # longer than a batch: the next save must wait for this one
    trainer = make_trainer([CheckpointCallback(tmp_path, every_n_batches=1, background=True, save_last=False)],
                           n_epochs=1)
    started = time.monotonic()
    trainer.run()
    assert time.monotonic() - started >= 13 * 0.2  # every write happened, one after the other
    assert writes.most == 1
    assert not _save_threads()
    assert listing(tmp_path)[-1] == "step_00000013-epoch_1-batch_0"  # the last one, written before run() returned
    assert len(list_checkpoints(str(tmp_path))) == 13


def test_a_failed_background_write_stops_training_and_keeps_the_previous_checkpoint(tmp_path, writes) -> None:
    writes.fail_folder = "step_00000010-epoch_0-batch_10"
    trainer = make_trainer([CheckpointCallback(tmp_path, every_n_batches=5, background=True, keep_last_n=1)])
    with pytest.raises(CallbackError) as raised:
        trainer.run()
    assert isinstance(raised.value.__cause__, OSError) and "injected" in str(raised.value.__cause__)
    # raised at a batch boundary once the write had failed, at the latest when the next save is due
    assert 10 < trainer.global_forward_batches <= 15
    assert listing(tmp_path) == ["step_00000005-epoch_0-batch_5"]  # no temp folder; the only intact one kept
    seed_everything(0)
    resumed = make_trainer()
    resumed.load_checkpoint(tmp_path / "step_00000005-epoch_0-batch_5")
    assert resumed.global_forward_batches == 5


def test_a_write_that_fails_at_the_end_of_the_run_is_raised_by_run(tmp_path, writes) -> None:
    writes.fail_folder = "step_00000039-epoch_3-batch_0"
    trainer = make_trainer([CheckpointCallback(tmp_path, every_n_batches=13, background=True, save_last=False)])
    with pytest.raises(CallbackError) as raised:
        trainer.run()
    assert "injected" in str(raised.value.__cause__)
    assert trainer.global_forward_batches == TOTAL
    assert listing(tmp_path) == ["step_00000013-epoch_1-batch_0", "step_00000026-epoch_2-batch_0"]


def test_a_failed_run_completes_the_save_in_flight_and_its_exception_checkpoint(tmp_path, writes) -> None:
    writes.delay = 0.3
    trainer = make_trainer([CheckpointCallback(tmp_path, every_n_batches=4, background=True,
                                               save_on_exception=True)])
    stop_after(trainer, 5)  # the save of step 4 is still being written
    with pytest.raises(CallbackError) as raised:
        trainer.run()
    assert isinstance(raised.value.__cause__, Stop)
    assert listing(tmp_path) == ["exception-step_00000005", "step_00000004-epoch_0-batch_4"]
    for name in listing(tmp_path):
        read_checkpoint(str(tmp_path / name))  # every file verifies


def test_a_failed_background_write_on_a_failed_run_is_a_warning(tmp_path, writes) -> None:
    writes.delay, writes.fail_folder = 0.2, "step_00000004-epoch_0-batch_4"
    trainer = make_trainer([CheckpointCallback(tmp_path, every_n_batches=4, background=True)])
    stop_after(trainer, 5)
    with pytest.warns(RuntimeWarning, match=r"background save .*step_00000004.* failed after CallbackError"):
        with pytest.raises(CallbackError) as raised:
            trainer.run()
    assert isinstance(raised.value.__cause__, Stop)  # the training error is what run() raises
    assert listing(tmp_path) == []


def test_top_k_in_the_background_trims_after_each_commit(tmp_path, writes) -> None:
    scores = {3: 0.5, 6: 0.9, 9: 0.7, 12: 0.95}
    keeper = CheckpointCallback(tmp_path, topk=2, monitor="score", background=True, save_last=False)
    trainer = make_trainer([keeper], script=from_table(scores), evaluate_every=3, n_epochs=1)
    trainer.run()
    assert listing(tmp_path) == ["topk-score_0.9-step_00000006", "topk-score_0.95-step_00000012"]
    assert keeper.best_checkpoint == str(tmp_path / "topk-score_0.95-step_00000012")


def test_a_sharded_background_save_resumes_bit_exactly(tmp_path, writes) -> None:
    def trainer(callbacks=()) -> Trainer:
        model = LinearModel(3, 1)
        return Trainer(model, ArrayLoader(make_regression(), batch_size=8), SGD(model.params, model.grads, lr=0.05),
                       driver=ShardingNumpyDriver(model), n_epochs=2, progress_bar=None, callbacks=list(callbacks))

    straight = trainer()
    straight.run()
    broken = trainer([CheckpointCallback(tmp_path, every_n_batches=3, background=True)])
    stop_after(broken, 10)
    with pytest.raises(CallbackError):
        broken.run()
    assert listing(tmp_path)[-1] == "step_00000009-epoch_1-batch_1"
    resumed = trainer()
    resumed.run(resume_from=tmp_path)
    for name, value in straight.driver.model.params.items():
        np.testing.assert_array_equal(resumed.driver.model.params[name], value)


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_kill9_during_background_writes_never_leaves_a_broken_checkpoint(tmp_path, monkeypatch) -> None:
    """Real processes of the kill -9 harness (``_kill9.py``) saving with ``background=True``: every folder under
    a checkpoint's real name verifies after each kill, and every resume ends bit-exact with the unbroken run."""
    monkeypatch.setenv(CHECKPOINT_KWARGS_ENV, '{"background": true}')  # the child's CheckpointCallback reads it
    start = time.monotonic()
    # a slow writer (sleeps before each file, on the worker thread) and quick batches: kills land mid-write
    tally = kill_rounds(str(tmp_path), 12, seed=39, driver="numpy", delays=Delays(save=0.004, step=0.008),
                        max_kills_per_round=4, timeout=60)
    print(f"\nkill -9 (numpy, background saves): {tally.summary()}; {time.monotonic() - start:.1f} s")
    assert tally.total_kills == 12 and tally.bit_exact_rounds == tally.rounds > 0
    assert tally.landed("save") >= 2, tally.kills
