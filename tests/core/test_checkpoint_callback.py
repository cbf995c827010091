"""CheckpointCallback on the numpy driver: triggers, names, rotation, top-k, resume, model-only saves."""

from __future__ import annotations

import io
import json
import os
from types import SimpleNamespace

import numpy as np
import pytest

from drivetrain import (
    Callback,
    CallbackError,
    CheckpointCallback,
    ConfigurationError,
    DrivetrainError,
    EarlyStopCallback,
    Event,
    RawTextProgress,
    seed_everything,
)

from ._callback_helpers import Stop, assert_same_params, from_table, listing, make_trainer, params, stop_after


def _manifest(path) -> dict:
    return json.loads((path / "manifest.json").read_text())


def _config_error(exc_info) -> ConfigurationError:
    """A ConfigurationError raised in a callback's handler may come wrapped in a CallbackError."""
    err = exc_info.value
    if not isinstance(err, ConfigurationError):
        assert isinstance(err, CallbackError) and isinstance(err.__cause__, ConfigurationError)
    return err


# ---------------------------------------------------------------- arguments
@pytest.mark.parametrize("kwargs, match", [
    (dict(every_n_batches=0), r"every_n_batches=0\) is not accepted; pass an int >= 1, or None"),
    (dict(every_n_batches=True), r"every_n_batches=True\) is not accepted"),
    (dict(every_n_epochs=-2), r"every_n_epochs=-2\) is not accepted; pass an int >= 1"),
    (dict(topk=-1), r"topk=-1\) is not accepted; pass an int >= 0"),
    (dict(topk=1.5), r"topk=1.5\) is not accepted"),
    (dict(save_object="weights"), r"save_object='weights'\) is not accepted; pass 'trainer' .* or 'model'"),
    (dict(every_n_batches=2, save_total_limit=0), r"save_total_limit=0\) is not accepted; pass an int >= 1"),
    (dict(save_last=False), r"saves nothing: set every_n_batches, every_n_epochs, save_last, save_on_exception or topk"),
    (dict(save_last="yes"), r"save_last='yes'\) is not accepted; pass True or False"),
    (dict(save_total_limit=2), r"save_total_limit=2\) limits periodic checkpoints, but neither every_n_batches"),
    (dict(monitor="acc"), r"monitor/larger_better are used only for top-k checkpoints, but topk=0"),
    (dict(topk=1, monitor=3), r"monitor=3\) is not accepted; pass a result name"),
    (dict(topk=1, larger_better="max"), r"larger_better='max'\) is not accepted; pass True, False, or None"),
    (dict(save_object="model", allow_pickle=True), r"allow_pickle=True\) has no effect with save_object='model'"),
])
def test_bad_arguments_fail_at_construction(kwargs, match, tmp_path):
    with pytest.raises(ConfigurationError, match=match):
        CheckpointCallback(tmp_path / "ckpt", **kwargs)


def test_folder_must_not_be_a_file(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(ConfigurationError, match=r"folder=.* is an existing file; pass a folder path"):
        CheckpointCallback(tmp_path / "f")
    with pytest.raises(ConfigurationError, match=r"folder=None\) is not accepted"):
        CheckpointCallback(None)


def test_topk_without_any_monitor_names_the_fix(tmp_path):
    with pytest.raises(DrivetrainError, match=r"topk=2 needs a monitor, .*pass monitor='<result name>'") as info:
        make_trainer([CheckpointCallback(tmp_path, topk=2)], script=lambda s: 0.0)
    _config_error(info)
    with pytest.raises(DrivetrainError, match=r"topk=1 needs evaluation results.*pass metrics= and evaluate_dataloaders="):
        make_trainer([CheckpointCallback(tmp_path, topk=1, monitor="score")])
    with pytest.raises(DrivetrainError, match=r"monitor='nope' names no"):
        make_trainer([CheckpointCallback(tmp_path, topk=1, monitor="nope")], script=lambda s: 0.0)


# ----------------------------------------------------------------- triggers
def test_every_n_batches_names_and_contents(tmp_path):
    trainer = make_trainer([CheckpointCallback(tmp_path, every_n_batches=5, save_last=False)])
    trainer.run()
    steps = range(5, 40, 5)
    assert listing(tmp_path) == [f"step_{s:08d}-epoch_{s // 13}-batch_{s % 13}" for s in steps]  # sorted: step order
    manifest = _manifest(tmp_path / "step_00000015-epoch_1-batch_2")
    assert manifest["kind"] == "trainer"
    assert (manifest["trainer"]["epoch"], manifest["trainer"]["batches_done"]) == (1, 2)
    assert manifest["trainer"]["global_forward_batches"] == 15


def test_every_n_epochs_and_last(tmp_path):
    trainer = make_trainer([CheckpointCallback(tmp_path, every_n_epochs=2)], n_epochs=5)
    trainer.run()
    assert listing(tmp_path) == ["last", "step_00000026-epoch_2-batch_0", "step_00000052-epoch_4-batch_0"]
    manifest = _manifest(tmp_path / "step_00000026-epoch_2-batch_0")["trainer"]
    assert (manifest["epoch"], manifest["batches_done"], manifest["global_forward_batches"]) == (2, 0, 26)
    assert _manifest(tmp_path / "last")["trainer"]["global_forward_batches"] == 65


def test_a_batch_save_at_the_end_of_an_epoch_is_not_repeated_by_the_epoch_save(tmp_path):
    trainer = make_trainer([CheckpointCallback(tmp_path, every_n_batches=13, every_n_epochs=1, save_last=False)],
                           n_epochs=2)
    trainer.run()
    # Saved once the step is complete, i.e. after the end of the epoch: named by the position a resume sees.
    assert listing(tmp_path) == ["step_00000013-epoch_1-batch_0", "step_00000026-epoch_2-batch_0"]


def test_last_is_written_on_a_normal_end_only(tmp_path):
    trainer = make_trainer([CheckpointCallback(tmp_path)])
    stop_after(trainer, 7)
    with pytest.raises(CallbackError):
        trainer.run()
    assert listing(tmp_path) == []  # a failed run writes no `last`: resume must not mistake it for the end
    trainer = make_trainer([CheckpointCallback(tmp_path)], n_epochs=1)
    trainer.run()
    assert listing(tmp_path) == ["last"]
    assert _manifest(tmp_path / "last")["trainer"]["global_forward_batches"] == 13


def test_last_replaces_an_existing_last(tmp_path):
    make_trainer([CheckpointCallback(tmp_path)], n_epochs=1).run()
    trainer = make_trainer([CheckpointCallback(tmp_path)], n_epochs=2)
    trainer.run()
    assert listing(tmp_path) == ["last"]
    assert _manifest(tmp_path / "last")["trainer"]["global_forward_batches"] == 26


def test_save_on_exception(tmp_path):
    trainer = make_trainer([CheckpointCallback(tmp_path, save_on_exception=True)])
    stop_after(trainer, 7)
    with pytest.raises(CallbackError) as info:
        trainer.run()
    assert isinstance(info.value.__cause__, Stop)
    assert listing(tmp_path) == ["exception-step_00000007"]
    assert _manifest(tmp_path / "exception-step_00000007")["trainer"]["global_forward_batches"] == 7
    assert _manifest(tmp_path / "exception-step_00000007")["trainer"]["after_exception"] == "CallbackError"


def test_exception_checkpoint_is_never_resumed_silently(tmp_path):
    """A checkpoint written while a run failed (here after every callback of batch 7 ran, so it is even
    between batches) is not what resume_from=<folder> or "latest" picks: they take the newest periodic one.
    Named explicitly it still resumes (it may be all there is), with a warning that says what to do instead."""
    trainer = make_trainer([CheckpointCallback(tmp_path, every_n_batches=4, save_on_exception=True)])
    stop_after(trainer, 7)
    with pytest.raises(CallbackError):
        trainer.run()
    assert listing(tmp_path) == ["exception-step_00000007", "step_00000004-epoch_0-batch_4"]

    for resume_from in (tmp_path, "latest"):  # "latest" looks in the folders of the trainer's CheckpointCallbacks
        resumed = make_trainer([CheckpointCallback(tmp_path, save_last=False, save_on_exception=True)], n_epochs=1)
        seen: list[int] = []
        resumed.add_callback_fn(Event.on_train_begin(), lambda t, seen=seen: seen.append(t.global_forward_batches))
        resumed.run(resume_from=resume_from)
        assert seen == [4]

    explicit = make_trainer(n_epochs=1)
    with pytest.warns(RuntimeWarning, match=r"exception-step_00000007 was written while handling CallbackError .*"
                                            r"not sample-exact\. For an exact resume pass resume_from="):
        explicit.run(resume_from=tmp_path / "exception-step_00000007")
    assert explicit.global_forward_batches == 13


def test_early_stop_is_a_normal_end(tmp_path):
    """EarlyStopException writes `last` and no exception checkpoint."""
    cb = CheckpointCallback(tmp_path, save_on_exception=True)
    trainer = make_trainer([EarlyStopCallback(patience=2), cb], script=lambda s: 1.0, monitor="score")
    trainer.run(num_eval_sanity_batch=0)
    assert trainer.global_forward_batches == 3
    assert listing(tmp_path) == ["last"]


def test_folder_names_sort_in_step_order(tmp_path):
    """Plain string order is step order across 1, 2 and 3 digit steps (9 < 18 < ... < 99 < 108)."""
    make_trainer([CheckpointCallback(tmp_path, every_n_batches=9, save_last=False)], n_batches=108).run()
    names = listing(tmp_path)  # sorted as strings
    assert [_manifest(tmp_path / n)["trainer"]["global_forward_batches"] for n in names] == list(range(9, 109, 9))
    assert names[0] == "step_00000009-epoch_0-batch_9" and names[-1] == "step_00000108-epoch_8-batch_4"


def test_resume_picks_the_newest_step_whatever_the_names(tmp_path):
    """Folders named the old way (epoch_{e}-batch_{b}-step_{s}) sit next to new ones: the manifests decide."""
    make_trainer([CheckpointCallback(tmp_path, every_n_batches=1, save_last=False)], n_batches=10).run()
    # As strings, the old name of the newest checkpoint sorts before every new name.
    os.rename(tmp_path / "step_00000010-epoch_0-batch_10", tmp_path / "epoch_0-batch_10-step_10")
    assert listing(tmp_path)[0] == "epoch_0-batch_10-step_10"
    begins = []
    resumed = make_trainer(n_epochs=2)
    resumed.add_callback_fn(Event.on_train_begin(), lambda t: begins.append(t.global_forward_batches))
    resumed.run(resume_from=tmp_path)
    assert begins == [10]


def test_old_periodic_names_in_a_checkpoint_state_stay_managed(tmp_path):
    """A run resumed from a checkpoint of an earlier version keeps rotating the old-named folders."""
    old = ["epoch_0-batch_9-step_9", "epoch_0-batch_10-step_10"]
    for name in old:
        (tmp_path / name).mkdir()
    cb = CheckpointCallback(tmp_path, every_n_batches=1, save_total_limit=2)
    cb.on_load_checkpoint(None, {"periodic": old, "topk": [], "last_periodic_step": 10})
    assert cb.on_save_checkpoint(None)["periodic"] == old


class InterruptingSave(Callback):
    """Hit Ctrl-C while the CheckpointCallback collects the states of its ``save``-th save."""

    def __init__(self, save: int) -> None:
        self.save, self.saves = save, 0

    def on_save_checkpoint(self, trainer):
        self.saves += 1
        if self.saves == self.save:
            raise KeyboardInterrupt
        return None


def interrupt_at_18(trainer):
    if trainer.global_forward_batches == 18:
        raise KeyboardInterrupt


@pytest.mark.parametrize("where", ["after a batch", "inside a save"])
def test_keyboard_interrupt_keeps_the_last_checkpoint_and_says_what_stopped_training(where, tmp_path):
    """Ctrl-C at batch 18 (epoch 2): the summary says so, the interrupt reaches the caller, the checkpoint of
    step 15 resumes."""
    log = io.StringIO()
    callbacks = [CheckpointCallback(tmp_path, every_n_batches=3, save_total_limit=2),
                 RawTextProgress(print_every=100, file=log)]
    if where == "inside a save":
        callbacks.append(InterruptingSave(save=6))  # the save of step 18, written before batch 19
    trainer = make_trainer(callbacks)
    if where == "after a batch":  # after the CheckpointCallback marked the save of step 18 as due
        trainer.add_callback_fn(Event.on_train_batch_end(), interrupt_at_18)
    with pytest.raises(KeyboardInterrupt):
        trainer.run()
    summary = log.getvalue().splitlines()[-1]
    assert summary.startswith("training stopped at step 18 (epoch 2) by KeyboardInterrupt; after "), summary
    assert "finished" not in log.getvalue()
    # No half checkpoint, no `last` (the state may be mid-step), the two newest complete ones intact.
    assert listing(tmp_path) == ["step_00000012-epoch_0-batch_12", "step_00000015-epoch_1-batch_2"]
    seed_everything(0)
    begins = []
    resumed = make_trainer([CheckpointCallback(tmp_path, every_n_batches=3, save_total_limit=2)])
    resumed.add_callback_fn(Event.on_train_begin(), lambda t: begins.append(t.global_forward_batches))
    resumed.run(resume_from=tmp_path)
    assert begins == [15] and resumed.global_forward_batches == 39
    assert listing(tmp_path) == ["last", "step_00000036-epoch_2-batch_10", "step_00000039-epoch_3-batch_0"]


# ----------------------------------------------------------------- rotation
@pytest.mark.parametrize("limit", [1, 2, 3])
def test_rotation_keeps_the_newest(limit, tmp_path):
    kept_after_each_save = []

    def record(t, batch, indices):  # the save of batch s is written before batch s + 1 starts
        if t.global_forward_batches % 3 == 0 and t.global_forward_batches:
            kept_after_each_save.append(listing(tmp_path))

    trainer = make_trainer([CheckpointCallback(tmp_path, every_n_batches=3, save_total_limit=limit, save_last=False)])
    trainer.add_callback_fn(Event.on_train_batch_begin(), record)
    trainer.run()
    kept_after_each_save.append(listing(tmp_path))
    assert len(kept_after_each_save) == 13
    for i, kept in enumerate(kept_after_each_save):
        newest = 3 * (i + 1)
        steps = sorted(int(n.split("-")[0].removeprefix("step_")) for n in kept)
        assert steps == list(range(max(3, newest - 3 * (limit - 1)), newest + 1, 3))
    assert not any(n.startswith(".tmp-") for n in listing(tmp_path))


def test_rotation_and_resume_continue_the_same_list(tmp_path):
    """A run killed after batch 17 and resumed from the folder keeps rotating the same checkpoints."""
    seed_everything(0)
    reference = make_trainer([CheckpointCallback(tmp_path / "ref", every_n_batches=3, save_total_limit=2)])
    reference.run()

    seed_everything(0)
    first = make_trainer([CheckpointCallback(tmp_path / "ckpt", every_n_batches=3, save_total_limit=2)])
    stop_after(first, 17)
    with pytest.raises(CallbackError):
        first.run()
    assert listing(tmp_path / "ckpt") == ["step_00000012-epoch_0-batch_12", "step_00000015-epoch_1-batch_2"]

    seed_everything(99)
    seen = []
    resumed = make_trainer([CheckpointCallback(tmp_path / "ckpt", every_n_batches=3, save_total_limit=2)],
                           seed_model=4)
    resumed.add_callback_fn(Event.on_train_batch_end(), lambda t: seen.append(listing(tmp_path / "ckpt")))
    resumed.run(resume_from=tmp_path / "ckpt")
    assert seen[0] == seen[2] == ["step_00000012-epoch_0-batch_12", "step_00000015-epoch_1-batch_2"]  # batches 16-18
    assert seen[3] == ["step_00000015-epoch_1-batch_2", "step_00000018-epoch_1-batch_5"]  # the first new save rotated out 12
    assert listing(tmp_path / "ckpt") == listing(tmp_path / "ref") == [
        "last", "step_00000036-epoch_2-batch_10", "step_00000039-epoch_3-batch_0"]
    assert_same_params(resumed, reference)


def test_resume_from_the_folder_is_bit_exact(tmp_path):
    """The newest complete checkpoint is taken (a half-written one is ignored) and training ends identically."""
    def run(callbacks, **kw):
        return make_trainer(callbacks, accumulation_steps=3, **kw)

    seed_everything(0)
    reference = run(None)
    reference.run()

    seed_everything(0)
    first = run([CheckpointCallback(tmp_path, every_n_batches=4)])
    stop_after(first, 14)
    with pytest.raises(CallbackError):
        first.run()
    half = tmp_path / ".tmp-step_00000016-epoch_1-batch_3-1-abcd"
    half.mkdir()
    (half / "model.safetensors").write_bytes(b"half")
    seed_everything(7)
    begins = []
    resumed = run([CheckpointCallback(tmp_path, every_n_batches=4)], seed_model=3)
    resumed.add_callback_fn(Event.on_train_begin(), lambda t: begins.append(t.global_forward_batches))
    resumed.run(resume_from=tmp_path)
    assert begins == [12]
    assert_same_params(resumed, reference)
    assert not half.exists()


# --------------------------------------------------------------------- topk
SCRIPT = {2: 0.5, 4: 0.9, 6: 0.1, 8: 0.7, 10: 0.95, 12: 0.3, 14: 0.9, 16: 0.2}


@pytest.mark.parametrize("larger_better, expected", [
    (True, ["topk-score_0.95-step_00000010", "topk-score_0.9-step_00000004"]),  # 0.9 at step 14 ties: the older stays
    (False, ["topk-score_0.1-step_00000006", "topk-score_0.2-step_00000016"]),
])
@pytest.mark.parametrize("on_trainer", [False, True])
def test_topk_keeps_exactly_the_k_best(larger_better, expected, on_trainer, tmp_path):
    if on_trainer:  # monitor and direction come from the Trainer
        cb = CheckpointCallback(tmp_path, topk=2, save_last=False)
        kw = dict(monitor="score", larger_better=larger_better)
    else:
        cb = CheckpointCallback(tmp_path, topk=2, monitor="score", larger_better=larger_better, save_last=False)
        kw = {}
    counts = []
    trainer = make_trainer([cb], script=from_table(SCRIPT), evaluate_every=2, n_batches=16, **kw)
    trainer.add_callback_fn(Event.on_evaluate_begin(), lambda t: counts.append(len(listing(tmp_path))))
    trainer.run(num_eval_sanity_batch=0)
    assert sorted(listing(tmp_path)) == sorted(expected)
    assert counts == [0, 1, 2, 2, 2, 2, 2, 2]
    manifest = _manifest(tmp_path / expected[0])["trainer"]
    assert manifest["global_forward_batches"] == int(expected[0].rsplit("_", 1)[1])


def test_topk_with_a_function_monitor_and_nan_values(tmp_path):
    def neg_score(results):
        return -results["score#score"]

    cb = CheckpointCallback(tmp_path, topk=1, monitor=neg_score, larger_better=True, save_last=False)
    script = from_table({1: float("nan"), 2: -3.0, 3: -1.0, 4: float("nan")})
    make_trainer([cb], script=script, n_batches=4).run(num_eval_sanity_batch=0)
    assert listing(tmp_path) == ["topk-neg_score_3-step_00000002"]


def test_topk_and_rotation_continue_after_resume(tmp_path):
    script = from_table({s: v for s, v in zip(range(2, 40, 2), [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8],
                                               strict=True)})

    def callback(folder):
        return CheckpointCallback(folder, every_n_batches=7, save_total_limit=1, topk=3, monitor="score",
                                  save_last=False)

    seed_everything(0)
    reference = make_trainer([callback(tmp_path / "ref")], script=script, evaluate_every=2)
    reference.run(num_eval_sanity_batch=0)

    seed_everything(0)
    first = make_trainer([callback(tmp_path / "ckpt")], script=script, evaluate_every=2)
    stop_after(first, 15)  # killed after batch 15: the newest checkpoint is that of batch 14
    with pytest.raises(CallbackError):
        first.run(num_eval_sanity_batch=0)
    assert listing(tmp_path / "ckpt") == [
        "step_00000014-epoch_1-batch_1", "topk-score_4-step_00000006", "topk-score_5-step_00000010", "topk-score_9-step_00000012"]
    resumed = make_trainer([callback(tmp_path / "ckpt")], script=script, evaluate_every=2, seed_model=2)
    resumed.run(resume_from=tmp_path / "ckpt", num_eval_sanity_batch=0)
    assert listing(tmp_path / "ckpt") == listing(tmp_path / "ref") == [
        "step_00000035-epoch_2-batch_9", "topk-score_9-step_00000012", "topk-score_9-step_00000026", "topk-score_9-step_00000030"]
    assert_same_params(resumed, reference)


# --------------------------------------------------------------- model only
def test_save_object_model_writes_loadable_weights(tmp_path):
    trainer = make_trainer([CheckpointCallback(tmp_path, every_n_epochs=1, save_total_limit=1, save_object="model")])
    trainer.run()
    assert listing(tmp_path) == ["last", "step_00000039-epoch_3-batch_0"]
    assert sorted(os.listdir(tmp_path / "last")) == ["manifest.json", "model.safetensors"]
    fresh = make_trainer(seed_model=8)
    assert not np.array_equal(fresh.model.params["weight"], trainer.model.params["weight"])
    fresh.load_model(tmp_path / "last")
    assert_same_params(fresh, trainer)
    fresh.load_model(tmp_path / "step_00000039-epoch_3-batch_0")
    assert_same_params(fresh, trainer)


def test_topk_of_model_files(tmp_path):
    cb = CheckpointCallback(tmp_path / "best", topk=1, monitor="score", save_object="model", save_last=False)
    kept = {}

    def remember(t, results):
        if results["score#score"] == 9:
            kept.update(params(t))

    trainer = make_trainer([cb], script=from_table({3: 1, 5: 9, 7: 2}), n_batches=8)
    trainer.add_callback_fn(Event.on_evaluate_end(), remember)
    trainer.run(num_eval_sanity_batch=0)
    assert listing(tmp_path / "best") == ["topk-score_9-step_00000005"]
    fresh = make_trainer()
    fresh.load_model(tmp_path / "best" / "topk-score_9-step_00000005")
    for name, value in kept.items():
        np.testing.assert_array_equal(fresh.model.params[name], value)


# --------------------------------------------------------------------- state
def test_two_checkpoint_callbacks_keep_separate_states(tmp_path):
    periodic = CheckpointCallback(tmp_path / "ckpt", every_n_batches=10)
    best = CheckpointCallback(tmp_path / "best", topk=1, monitor="score", save_object="model", save_last=False)
    assert periodic.callback_name != best.callback_name
    trainer = make_trainer([periodic, best], script=lambda s: -abs(s - 6), n_batches=12)
    trainer.run(num_eval_sanity_batch=0)
    assert listing(tmp_path / "best") == ["topk-score_0-step_00000006"]
    state = json.loads((tmp_path / "ckpt" / "last" / "training_state.json").read_text())["callbacks"]
    assert state["CheckpointCallback:best"]["topk"] == [["topk-score_0-step_00000006", 0.0]]
    assert state["CheckpointCallback:ckpt"]["periodic"] == ["step_00000010-epoch_0-batch_10"]


def test_loaded_state_never_points_outside_the_folder(tmp_path):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "victim").mkdir()
    (tmp_path / "ckpt" / "step_00000001-epoch_0-batch_1").mkdir()
    cb = CheckpointCallback(tmp_path / "ckpt", every_n_batches=1, save_total_limit=1)
    cb.on_load_checkpoint(None, {"periodic": ["../victim", "/abs/path", "step_00000001-epoch_0-batch_1", "step_00000002-epoch_0-batch_2"],
                                 "topk": [["../victim", 1.0]], "last_periodic_step": 1})
    assert cb.on_save_checkpoint(None)["periodic"] == ["step_00000001-epoch_0-batch_1"]
    assert cb.on_save_checkpoint(None)["topk"] == []


class Tally(Callback):
    """Counts batches and evaluations; listed after the CheckpointCallback on purpose."""

    def __init__(self):
        self.batches = self.evaluations = 0

    def on_train_batch_end(self, trainer):
        self.batches += 1

    def on_evaluate_end(self, trainer, results):
        self.evaluations += 1

    def on_save_checkpoint(self, trainer):
        return {"batches": self.batches, "evaluations": self.evaluations}

    def on_load_checkpoint(self, trainer, states):
        self.batches, self.evaluations = states["batches"], states["evaluations"]


def test_a_save_waits_for_the_evaluation_and_later_callbacks_of_its_step(tmp_path):
    """Saving every 3 batches and evaluating every 3 batches: a resume neither repeats nor skips anything."""
    def build(folder):
        return make_trainer([CheckpointCallback(folder, every_n_batches=3), Tally()], script=lambda s: s,
                            evaluate_every=3)

    first = build(tmp_path)
    stop_after(first, 10)
    with pytest.raises(CallbackError):
        first.run(num_eval_sanity_batch=0)
    state = json.loads((tmp_path / "step_00000009-epoch_0-batch_9" / "training_state.json").read_text())
    assert state["callbacks"]["Tally"] == {"batches": 9, "evaluations": 3}
    resumed = build(tmp_path)
    resumed.run(resume_from=tmp_path, num_eval_sanity_batch=0)
    assert (resumed.callbacks[1].batches, resumed.callbacks[1].evaluations) == (39, 13)


def test_evaluate_outside_run_saves_a_topk_checkpoint_at_once(tmp_path):
    trainer = make_trainer([CheckpointCallback(tmp_path, topk=1, monitor="score", save_last=False)],
                           script=lambda s: 0.5)
    trainer.evaluate()
    assert listing(tmp_path) == ["topk-score_0.5-step_00000000"]


def test_in_distributed_runs_rank_zeros_view_of_the_folder_decides(tmp_path):
    class FakeDistributedDriver:
        def is_distributed(self):
            return True

        def broadcast_object(self, obj, src=0):
            return [], [("topk-score_1-step_00000004", 1.0)]  # what rank 0 found

    (tmp_path / "step_00000002-epoch_0-batch_2").mkdir()
    cb = CheckpointCallback(tmp_path, every_n_batches=2, topk=1, monitor="score")
    cb._monitor = "score"
    cb.on_load_checkpoint(SimpleNamespace(driver=FakeDistributedDriver()),
                          {"periodic": ["step_00000002-epoch_0-batch_2"], "topk": [], "monitor": "score"})
    state = cb.on_save_checkpoint(None)
    assert state["periodic"] == [] and state["topk"] == [["topk-score_1-step_00000004", 1.0]]


def test_a_resume_that_monitors_something_else_starts_a_new_topk_list(tmp_path):
    make_trainer([CheckpointCallback(tmp_path, topk=1, monitor="score")], script=lambda s: s,
                 n_batches=3).run(num_eval_sanity_batch=0)

    def other(results):
        return -results["score#score"]

    resumed = make_trainer([CheckpointCallback(tmp_path, topk=1, monitor=other)], script=lambda s: s, n_batches=16)
    with pytest.warns(RuntimeWarning, match=r"ranked by 'score', this run monitors 'other'; starting a new top-k"):
        resumed.run(resume_from=tmp_path / "last", num_eval_sanity_batch=0)
    assert listing(tmp_path) == ["last", "topk-other_-4-step_00000004", "topk-score_3-step_00000003"]
