"""The best model (Trainer.best_checkpoint, load_best_model, load_best_model_at_end), timed periodic
checkpoints (every_n_seconds) and keep_last_n, on the numpy driver."""

from __future__ import annotations

import math
import os
import shutil
import time
from types import SimpleNamespace

import numpy as np
import pytest

from drivetrain import (
    CallbackError,
    CheckpointCallback,
    CheckpointError,
    ConfigurationError,
    EarlyStopCallback,
    Event,
)
from drivetrain_numpy.driver import NumpyDriver

from ._callback_helpers import assert_same_params, from_table, listing, make_trainer, params, stop_after


def remember_params(trainer, at: dict) -> None:
    """Keep the parameters of every evaluation in ``at``, by step (the state a top-k checkpoint holds)."""
    trainer.add_callback_fn(Event.on_evaluate_end(), lambda t, results: at.update({t.global_forward_batches: params(t)}))


def assert_params_are(trainer, expected: dict) -> None:
    for name, value in expected.items():
        np.testing.assert_array_equal(trainer.model.params[name], value)


# ---------------------------------------------------------------- arguments
@pytest.mark.parametrize("kwargs, match", [
    (dict(every_n_seconds=0), r"every_n_seconds=0\) is not accepted; pass a number of seconds > 0 .*or None"),
    (dict(every_n_seconds=-5.0), r"every_n_seconds=-5.0\) is not accepted"),
    (dict(every_n_seconds=True), r"every_n_seconds=True\) is not accepted"),
    (dict(every_n_seconds="60"), r"every_n_seconds='60'\) is not accepted"),
    (dict(every_n_seconds=math.inf), r"every_n_seconds=inf\) is not accepted"),
    (dict(every_n_seconds=math.nan), r"every_n_seconds=nan\) is not accepted"),
    (dict(every_n_batches=2, keep_last_n=0), r"keep_last_n=0\) is not accepted; pass an int >= 1, or None"),
    (dict(every_n_batches=2, keep_last_n=1.5), r"keep_last_n=1.5\) is not accepted"),
    (dict(every_n_batches=2, keep_last_n=2, save_total_limit=2),
     r"keep_last_n=2, save_total_limit=2\) gives one setting twice: save_total_limit is Hugging Face's name "
     r"for keep_last_n; pass only keep_last_n"),
    (dict(keep_last_n=3), r"keep_last_n=3\) limits periodic checkpoints, but neither every_n_batches nor "
                          r"every_n_epochs nor every_n_seconds is set; set one of them or drop keep_last_n"),
    (dict(topk=1, load_best_model_at_end="yes"), r"load_best_model_at_end='yes'\) is not accepted; pass True or False"),
    (dict(load_best_model_at_end=True), r"load_best_model_at_end=True\) loads the best top-k checkpoint, but "
                                        r"topk=0 keeps none; pass topk=1"),
    (dict(save_last=False), r"saves nothing: .*or every_n_seconds for time-based saves"),
])
def test_bad_new_arguments_fail_at_construction(kwargs, match, tmp_path):
    with pytest.raises(ConfigurationError, match=match):
        CheckpointCallback(tmp_path / "ckpt", **kwargs)


def test_every_n_seconds_alone_is_something_to_save(tmp_path):
    cb = CheckpointCallback(tmp_path, every_n_seconds=0.5, save_last=False, keep_last_n=2)
    assert (cb.every_n_seconds, cb.keep_last_n, cb.save_total_limit) == (0.5, 2, 2)
    cb.save_total_limit = 1  # one setting under two names
    assert cb.keep_last_n == 1


# ------------------------------------------------------------- keep_last_n
@pytest.mark.parametrize("name", ["keep_last_n", "save_total_limit"])
def test_keep_last_n_and_its_hugging_face_name_keep_the_newest_periodic_checkpoints(name, tmp_path):
    cb = CheckpointCallback(tmp_path, every_n_batches=5, save_last=False, **{name: 2})
    assert cb.keep_last_n == cb.save_total_limit == 2
    make_trainer([cb]).run()
    assert listing(tmp_path) == ["step_00000030-epoch_2-batch_4", "step_00000035-epoch_2-batch_9"]


# ----------------------------------------------------------- best_checkpoint
def test_best_checkpoint_is_the_best_topk_folder(tmp_path):
    cb = CheckpointCallback(tmp_path, topk=2, monitor="score", save_last=False)
    trainer = make_trainer([cb], script=from_table({3: 5, 5: 9, 7: 2, 9: 9}), n_batches=10)
    assert trainer.best_checkpoint is None
    trainer.run(num_eval_sanity_batch=0)
    best = str(tmp_path / "topk-score_9-step_00000005")  # the earlier of two equal values stays ahead
    assert trainer.best_checkpoint == cb.best_checkpoint == best
    assert os.path.isabs(trainer.best_checkpoint)
    assert listing(tmp_path) == ["topk-score_9-step_00000005", "topk-score_9-step_00000009"]


def test_best_checkpoint_follows_the_direction(tmp_path):
    trainer = make_trainer([CheckpointCallback(tmp_path, topk=1, monitor="score", larger_better=False)],
                           script=from_table({3: -4, 6: -7}, default=1.0), n_batches=8)
    trainer.run(num_eval_sanity_batch=0)
    assert trainer.best_checkpoint == str(tmp_path / "topk-score_-7-step_00000006")


def test_no_topk_callback_means_no_best_checkpoint(tmp_path):
    trainer = make_trainer([CheckpointCallback(tmp_path, every_n_batches=4)], n_batches=5)
    trainer.run()
    assert trainer.best_checkpoint is None
    assert make_trainer().best_checkpoint is None


def test_an_evaluation_outside_run_gives_a_best_checkpoint(tmp_path):
    trainer = make_trainer([CheckpointCallback(tmp_path, topk=1, monitor="score", save_last=False)],
                           script=lambda s: 0.5)
    trainer.evaluate()
    assert trainer.best_checkpoint == str(tmp_path / "topk-score_0.5-step_00000000")


def test_with_several_topk_callbacks_the_first_one_decides(tmp_path):
    by_score = CheckpointCallback(tmp_path / "a", topk=1, monitor="score", save_last=False)
    lowest = CheckpointCallback(tmp_path / "b", topk=1, monitor="score", larger_better=False, save_object="model",
                                save_last=False)
    plain = CheckpointCallback(tmp_path / "c", every_n_batches=100)
    trainer = make_trainer([plain, by_score, lowest], script=lambda s: -abs(s - 4), n_batches=6)
    trainer.run(num_eval_sanity_batch=0)
    assert trainer.best_checkpoint == by_score.best_checkpoint == str(tmp_path / "a" / "topk-score_0-step_00000004")
    assert lowest.best_checkpoint == str(tmp_path / "b" / "topk-score_-3-step_00000001")
    assert plain.best_checkpoint is None


# ----------------------------------------------------------- load_best_model
def test_load_best_model_restores_the_best_weights(tmp_path):
    seen: dict = {}
    trainer = make_trainer([CheckpointCallback(tmp_path, topk=2, monitor="score")],
                           script=from_table({4: 3, 8: 7, 11: 5}), n_batches=14)
    remember_params(trainer, seen)
    trainer.run(num_eval_sanity_batch=0)
    final = params(trainer)
    assert trainer.load_best_model() == str(tmp_path / "topk-score_7-step_00000008")
    assert_params_are(trainer, seen[8])
    assert not np.array_equal(trainer.model.params["weight"], final["weight"])


def test_load_best_model_reads_model_only_topk_checkpoints(tmp_path):
    seen: dict = {}
    trainer = make_trainer([CheckpointCallback(tmp_path, topk=1, monitor="score", save_object="model")],
                           script=from_table({6: 1}), n_batches=9)
    remember_params(trainer, seen)
    trainer.run(num_eval_sanity_batch=0)
    trainer.load_best_model()
    assert_params_are(trainer, seen[6])


def test_load_best_model_without_a_topk_callback_names_the_fix(tmp_path):
    with pytest.raises(ConfigurationError, match=r"load_best_model\(\) loads the best checkpoint of a "
                       r"CheckpointCallback with topk >= 1, and this trainer has none; add "
                       r"CheckpointCallback\(folder, topk=1\) to callbacks="):
        make_trainer().load_best_model()
    trainer = make_trainer([CheckpointCallback(tmp_path / "periodic", every_n_batches=3)])
    with pytest.raises(ConfigurationError, match=r"has none \(its CheckpointCallback\(s\) in '.*periodic' keep no "
                       r"top-k\).*trainer.load_model\(folder\)"):
        trainer.load_best_model()


def test_load_best_model_before_any_topk_save_names_the_fix(tmp_path):
    trainer = make_trainer([CheckpointCallback(tmp_path, topk=1, monitor="score")], script=lambda s: 1.0)
    with pytest.raises(ConfigurationError, match=r"CheckpointCallback\('.*', topk=1\) has saved no top-k "
                       r"checkpoint yet .*'score'.*call it after trainer.run\(\) or trainer.evaluate\(\)"):
        trainer.load_best_model()


def test_evaluations_that_give_nan_leave_no_best(tmp_path):
    trainer = make_trainer([CheckpointCallback(tmp_path, topk=1, monitor="score", save_last=False)],
                           script=lambda s: math.nan, n_batches=3)
    trainer.run(num_eval_sanity_batch=0)
    assert trainer.best_checkpoint is None
    with pytest.raises(ConfigurationError, match=r"has saved no top-k checkpoint yet .*not NaN"):
        trainer.load_best_model()


def test_a_best_checkpoint_deleted_by_hand_is_a_checkpoint_error(tmp_path):
    trainer = make_trainer([CheckpointCallback(tmp_path, topk=1, monitor="score")], script=lambda s: s, n_batches=3)
    trainer.run(num_eval_sanity_batch=0)
    shutil.rmtree(trainer.best_checkpoint)
    with pytest.raises(CheckpointError, match=r"the best checkpoint .*topk-score_3-step_00000003 \(top-k by "
                       r"'score'\) no longer exists.*trainer.load_model\(folder\)"):
        trainer.load_best_model()


def test_best_checkpoint_survives_a_resume(tmp_path):
    """The top-k list travels in the callback's state: a crashed run's best is known after a resume."""
    table = from_table({5: 8, 9: 3, 20: 6})
    seen: dict = {}

    def build():
        return make_trainer([CheckpointCallback(tmp_path, every_n_batches=6, topk=1, monitor="score")],
                            script=table, n_batches=24)

    first = build()
    remember_params(first, seen)
    stop_after(first, 14)
    with pytest.raises(CallbackError):
        first.run(num_eval_sanity_batch=0)
    best = str(tmp_path / "topk-score_8-step_00000005")
    loaded = build()
    loaded.load_checkpoint(tmp_path / "step_00000012-epoch_0-batch_12")
    assert loaded.best_checkpoint == best  # known without running
    resumed = build()
    resumed.run(resume_from=tmp_path, num_eval_sanity_batch=0)
    assert resumed.best_checkpoint == best  # nothing after the resume beat 8
    resumed.load_best_model()
    assert_params_are(resumed, seen[5])


# --------------------------------------------------- load_best_model_at_end
def test_load_best_model_at_end_loads_the_best_after_writing_last(tmp_path):
    seen: dict = {}
    trainer = make_trainer([CheckpointCallback(tmp_path, topk=1, monitor="score", load_best_model_at_end=True)],
                           script=from_table({7: 4}), n_batches=12)
    remember_params(trainer, seen)
    trainer.run(num_eval_sanity_batch=0)
    assert_params_are(trainer, seen[7])
    last = make_trainer()
    last.load_model(tmp_path / "last")  # `last` holds where training ended, not the best
    assert_params_are(last, seen[12])


def test_load_best_model_at_end_after_early_stopping(tmp_path):
    seen: dict = {}
    trainer = make_trainer([EarlyStopCallback(patience=2, monitor="score"),
                            CheckpointCallback(tmp_path, topk=1, monitor="score", load_best_model_at_end=True)],
                           script=lambda s: -abs(s - 3), n_batches=20)
    remember_params(trainer, seen)
    trainer.run(num_eval_sanity_batch=0)
    assert trainer.global_forward_batches == 5
    assert_params_are(trainer, seen[3])


def test_load_best_model_at_end_does_nothing_after_a_failure(tmp_path):
    trainer = make_trainer([CheckpointCallback(tmp_path, topk=1, monitor="score", load_best_model_at_end=True)],
                           script=from_table({2: 5}), n_batches=12)
    at_failure: dict = {}
    trainer.add_callback_fn(Event.on_train_batch_end(), lambda t: at_failure.update(params(t)))
    stop_after(trainer, 4)
    with pytest.raises(CallbackError):
        trainer.run(num_eval_sanity_batch=0)
    assert trainer.best_checkpoint == str(tmp_path / "topk-score_5-step_00000002")
    assert_params_are(trainer, at_failure)  # the state may be mid-step: nothing is loaded over it


def _loaded(folder):
    fresh = make_trainer()
    fresh.load_model(folder)
    return fresh


def test_load_best_model_at_end_without_a_best_warns(tmp_path):
    trainer = make_trainer([CheckpointCallback(tmp_path, topk=1, monitor="score", load_best_model_at_end=True)],
                           script=lambda s: math.nan, n_batches=3)
    with pytest.warns(RuntimeWarning, match=r"load_best_model_at_end=True\): no top-k checkpoint was saved in .*"
                      r"so the model keeps the weights training ended with"):
        trainer.run(num_eval_sanity_batch=0)


def test_load_best_model_at_end_on_two_callbacks_is_refused(tmp_path):
    with pytest.raises(ConfigurationError, match=r"load_best_model_at_end=True\) is set on 2 CheckpointCallbacks "
                       r"\(folders '.*a', '.*b'\), but the model can take only one best; set it on one of them"):
        make_trainer([CheckpointCallback(tmp_path / "a", topk=1, monitor="score", load_best_model_at_end=True),
                      CheckpointCallback(tmp_path / "b", topk=1, monitor="score", load_best_model_at_end=True)],
                     script=lambda s: 0.0)


# ------------------------------------------------------------- distributed
class FakeRanks(NumpyDriver):
    """The numpy driver as rank ``rank`` of a distributed run: ``broadcast_object`` answers what rank 0 would."""

    def __init__(self, model, *, rank: int = 0, rank0_says=None) -> None:
        super().__init__(model)
        self._rank, self.rank0_says, self.broadcasts = rank, rank0_says, []

    def is_distributed(self) -> bool:
        return True

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return 2

    def broadcast_object(self, obj, src=0):
        self.broadcasts.append(obj)
        return self.rank0_says(obj) if self.rank0_says is not None else obj


def test_every_rank_loads_the_folder_rank_0_names(tmp_path):
    first = make_trainer([CheckpointCallback(tmp_path, topk=2, monitor="score")], script=from_table({2: 5, 4: 9}),
                         n_batches=5)
    first.run(num_eval_sanity_batch=0)
    rank0_best = str(tmp_path / "topk-score_5-step_00000002")  # say rank 0 ranked differently: it wins
    trainer = make_trainer([CheckpointCallback(tmp_path, topk=2, monitor="score")], script=lambda s: 0.0)
    trainer.load_checkpoint(tmp_path / "last")
    driver = FakeRanks(trainer.model, rank=1, rank0_says=lambda obj: (rank0_best, None))
    trainer.driver = driver
    assert trainer.best_checkpoint == str(tmp_path / "topk-score_9-step_00000004")  # this rank's own view
    assert trainer.load_best_model() == rank0_best
    assert driver.broadcasts == [(str(tmp_path / "topk-score_9-step_00000004"), None)]
    assert_same_params(trainer, _loaded(rank0_best))


def test_a_rank_0_error_reaches_every_rank(tmp_path):
    trainer = make_trainer([CheckpointCallback(tmp_path, topk=1, monitor="score")], script=lambda s: 1.0, n_batches=2)
    trainer.run(num_eval_sanity_batch=0)
    trainer.driver = FakeRanks(trainer.model, rank=1, rank0_says=lambda obj: (None, "rank 0: it is gone"))
    with pytest.raises(CheckpointError, match="rank 0: it is gone"):
        trainer.load_best_model()


# ------------------------------------------------------------ every_n_seconds
class FakeClock:
    """A clock that moves only when told; ``tick`` seconds pass in every batch."""

    def __init__(self, tick: float) -> None:
        self.now, self.tick = 1000.0, tick

    def __call__(self) -> float:
        return self.now

    def batch_passes(self, trainer, batch, indices) -> None:
        self.now += self.tick


def _timed(tmp_path, clock: FakeClock, *, driver=None, **kwargs) -> tuple:
    cb = CheckpointCallback(tmp_path, every_n_seconds=5, save_last=False, **kwargs)
    cb.clock = clock
    trainer = make_trainer([cb], n_batches=26, **({"driver": driver} if driver is not None else {}))
    trainer.add_callback_fn(Event.on_train_batch_begin(), clock.batch_passes)
    return cb, trainer


def test_every_n_seconds_saves_when_the_time_is_up(tmp_path):
    clock = FakeClock(tick=1.0)
    _, trainer = _timed(tmp_path, clock)
    trainer.run()
    assert listing(tmp_path) == [f"step_{s:08d}-epoch_{s // 13}-batch_{s % 13}" for s in (5, 10, 15, 20, 25)]


def test_the_interval_counts_from_the_end_of_each_periodic_save(tmp_path):
    """Batch saves reset the clock too, and a slow save does not eat into the next interval; keep_last_n rotates."""
    clock = FakeClock(tick=1.0)
    cb, trainer = _timed(tmp_path, clock, every_n_batches=7, keep_last_n=3)
    original = trainer.save_checkpoint

    def slow_save(folder, **kwargs):
        clock.now += 2.5  # the save itself takes time
        return original(folder, **kwargs)

    trainer.save_checkpoint = slow_save
    trainer.run()
    # saved at 5 (time), 7 (batch), 12 (5 s after the save at 7 ended, not after it began), 14, 19, 21, 26
    steps = [int(name[5:13]) for name in listing(tmp_path)]
    assert steps == [19, 21, 26]
    assert cb.keep_last_n == 3


def test_every_n_seconds_on_the_real_clock(tmp_path):
    """No timing assertion that could race: at least one timed save, never more than one per batch."""
    cb = CheckpointCallback(tmp_path, every_n_seconds=0.001, save_last=False)
    trainer = make_trainer([cb], n_batches=6)
    trainer.add_callback_fn(Event.on_train_batch_end(), lambda t: time.sleep(0.002))
    trainer.run()
    assert 1 <= len(listing(tmp_path)) <= 6


def test_a_resumed_run_counts_the_interval_from_its_start(tmp_path):
    clock = FakeClock(tick=1.0)
    cb, first = _timed(tmp_path, clock, every_n_batches=8)
    stop_after(first, 9)
    with pytest.raises(CallbackError):
        first.run()
    clock.now += 10_000  # the time between the crash and the restart counts for nothing
    _, resumed = _timed(tmp_path, clock, every_n_batches=8)
    resumed.run(resume_from=tmp_path)
    assert [int(name[5:13]) for name in listing(tmp_path)] == [5, 8, 13, 16, 21, 24]


def test_in_distributed_runs_rank_0_decides_and_checks_are_few(tmp_path):
    clock = FakeClock(tick=1.0)
    cb = CheckpointCallback(tmp_path, every_n_seconds=64, save_last=False)
    cb.clock = clock
    trainer = make_trainer([cb], n_batches=130, n_epochs=10)
    trainer.driver = driver = FakeRanks(trainer.model)
    trainer.add_callback_fn(Event.on_train_batch_begin(), clock.batch_passes)
    trainer.run()
    assert [int(name[5:13]) for name in listing(tmp_path)] == [64, 128]  # on time, at a steady pace
    timed = [obj for obj in driver.broadcasts if isinstance(obj, tuple) and len(obj) == 2 and isinstance(obj[0], bool)]
    # each interval: the gap between checks at most doubles (2, 4, 8, 16) while about half the time left at 1 s a
    # batch is more, then follows it (16, 8, 4, 2, 1, 1, 1) and saves
    assert timed[:12] == [(False, 2), (False, 4), (False, 8), (False, 16), (False, 16), (False, 8), (False, 4),
                          (False, 2), (False, 1), (False, 1), (False, 1), (True, 1)]
    assert len(timed) <= 30  # not one collective per batch (130 batches)


def test_a_quick_first_batch_does_not_postpone_the_timed_save(tmp_path):
    """A first batch 100x quicker than the rest says little about the pace: the save still comes on time (the gap
    between checks grows at most twofold), where trusting it would have put the next check past the run's end."""
    clock = FakeClock(tick=1.0)
    cb = CheckpointCallback(tmp_path, every_n_seconds=20, save_last=False)
    cb.clock = clock
    trainer = make_trainer([cb], n_batches=40, n_epochs=1)
    trainer.driver = FakeRanks(trainer.model)
    trainer.add_callback_fn(Event.on_train_batch_begin(),
                            lambda t, b, i: setattr(clock, "now", clock.now + (0.01 if t.global_forward_batches == 0
                                                                                 else 1.0)))
    trainer.run()
    steps = [int(name[5:13]) for name in listing(tmp_path)]
    assert steps and steps[0] <= 23, steps  # due at 20 s (batch 21): a check at most a few batches later


def test_other_ranks_check_when_rank_0_says_and_follow_its_decision():
    said = iter([(False, 3), (True, 1), (False, 50)])
    driver = SimpleNamespace(is_distributed=lambda: True, is_global_zero=False, calls=[])

    def broadcast(obj, src=0):
        driver.calls.append(obj)
        return next(said)

    driver.broadcast_object = broadcast
    cb = CheckpointCallback("unused", every_n_seconds=60, save_last=False)
    trainer = SimpleNamespace(driver=driver, global_forward_batches=0)
    cb.clock = lambda: 0.0
    cb.on_train_begin(trainer)
    cb.clock = lambda: pytest.fail("a rank other than 0 never decides by its own clock")
    due_at = []
    for step in range(1, 12):
        trainer.global_forward_batches = step
        cb.on_train_batch_end(trainer)
        if cb._due.periodic:
            due_at.append(step)
            cb._due.periodic = False
    assert driver.calls == [None, None, None]  # checks at steps 1, 4 and 5; rank 1 sends nothing
    assert due_at == [4]
