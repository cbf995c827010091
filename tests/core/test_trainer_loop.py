"""The training loop through the public API, on the framework-free numpy driver."""

from __future__ import annotations

import numpy as np
import pytest

from drivetrain import Accuracy, Callback, Event, Trainer
from drivetrain_numpy import SGD, ArrayLoader, LinearModel

from .conftest import make_regression


def mse(model: LinearModel, data: dict) -> float:
    pred = data["x"] @ model.params["weight"] + model.params["bias"]
    return float(np.mean((pred - data["target"]) ** 2))


def test_training_reduces_loss(regression):
    model, opt, loader = regression
    before = mse(model, make_regression())
    Trainer(model, loader, opt, driver="numpy", n_epochs=5, progress_bar=None).run()
    assert mse(model, make_regression()) < before * 0.2


def test_driver_auto_picks_numpy_for_its_model(regression):
    model, opt, loader = regression
    trainer = Trainer(model, loader, opt, driver="auto", n_epochs=1, progress_bar=None)
    assert trainer.driver.name == "numpy"


def test_classification_with_evaluation_reaches_high_accuracy(classification):
    model, opt, train, dev = classification
    seen = []
    trainer = Trainer(model, train, opt, driver="numpy", n_epochs=4, evaluate_dataloaders={"dev": dev},
                      metrics={"acc": Accuracy()}, evaluate_every=-1, monitor="acc", progress_bar=None)
    trainer.add_callback_fn(Event.on_evaluate_end(), lambda t, results: seen.append(results))
    trainer.run()
    assert len(seen) == 4
    assert set(seen[-1]) == {"acc#acc#dev"}
    assert seen[-1]["acc#acc#dev"] >= 0.9
    assert trainer.monitor_value(seen[-1]) == seen[-1]["acc#acc#dev"]


def _recording_callback() -> Callback:
    from drivetrain._callbacks.events import EVENT_ARGS

    events: list[str] = []
    methods = {name: (lambda n: lambda self, trainer, *a: events.append(n))(name) for name in EVENT_ARGS
               if name not in ("on_save_checkpoint", "on_load_checkpoint")}
    cb = type("EveryEvent", (Callback,), methods)()
    cb.events = events
    return cb


def test_event_order_of_one_epoch_with_evaluation(classification):
    model, opt, train, dev = classification
    cb = _recording_callback()
    trainer = Trainer(model, ArrayLoader(train.arrays, batch_size=45), opt, driver="numpy", n_epochs=1,
                      evaluate_dataloaders=dev, metrics={"acc": Accuracy()}, evaluate_every=-1,
                      callbacks=[cb], progress_bar=None)
    trainer.run(num_eval_sanity_batch=1)
    batch = ["on_fetch_data_begin", "on_fetch_data_end", "on_train_batch_begin", "on_before_backward",
             "on_after_backward", "on_before_optimizers_step", "on_after_optimizers_step",
             "on_before_zero_grad", "on_after_zero_grad", "on_train_batch_end"]
    expected = (["on_after_trainer_initialized", "on_sanity_check_begin", "on_sanity_check_end",
                 "on_train_begin", "on_train_epoch_begin"] + batch * 2
                + ["on_train_epoch_end", "on_evaluate_begin", "on_evaluate_end",
                   "on_train_end"])
    assert cb.events == expected


def test_accumulation_equals_large_batch():
    data = make_regression(n=64)
    small = LinearModel(3, 1)
    big = LinearModel(3, 1)
    Trainer(small, ArrayLoader(data, batch_size=4), SGD(small.params, small.grads, lr=0.1), driver="numpy",
            n_epochs=2, accumulation_steps=4, progress_bar=None).run()
    Trainer(big, ArrayLoader(data, batch_size=16), SGD(big.params, big.grads, lr=0.1), driver="numpy",
            n_epochs=2, progress_bar=None).run()
    np.testing.assert_allclose(small.params["weight"], big.params["weight"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(small.params["bias"], big.params["bias"], rtol=1e-5, atol=1e-6)


def test_accumulation_last_partial_cycle_is_averaged_over_its_own_size():
    # 10 batches of 4 with accumulation 4: cycles of 4, 4 and 2 batches -> like batches of 16, 16, 8.
    data = make_regression(n=40)
    acc = LinearModel(3, 1)
    ref = LinearModel(3, 1)
    steps = []
    trainer = Trainer(acc, ArrayLoader(data, batch_size=4), SGD(acc.params, acc.grads, lr=0.1), driver="numpy",
                      n_epochs=1, accumulation_steps=4, progress_bar=None)
    trainer.add_callback_fn(Event.on_after_optimizers_step(), lambda t, opts: steps.append(t.batch_idx_in_epoch))
    trainer.run()
    opt = SGD(ref.params, ref.grads, lr=0.1)
    for lo, hi in ((0, 16), (16, 32), (32, 40)):
        ref.forward(data["x"][lo:hi], data["target"][lo:hi])["loss"].backward()
        opt.step()
        opt.zero_grad()
    assert steps == [3, 7, 9]  # batch index (0-based) at which each optimizer step happened
    np.testing.assert_allclose(acc.params["weight"], ref.params["weight"], rtol=1e-5, atol=1e-6)


def test_accumulation_uses_no_sync_on_all_but_the_last_micro_batch(regression):
    import contextlib

    model, opt, loader = regression
    trainer = Trainer(model, loader, opt, driver="numpy", n_epochs=1, accumulation_steps=3, progress_bar=None)
    unsynced = []

    @contextlib.contextmanager
    def spy_no_sync():
        unsynced.append(trainer.batch_idx_in_epoch)
        yield

    trainer.driver.no_sync = spy_no_sync
    trainer.run()
    # 8 batches in cycles of 3, 3, 2: every batch but the last of each cycle skips the gradient sync
    assert unsynced == [0, 1, 3, 4, 6]


def test_evaluate_every_positive_counts_batches(classification):
    model, opt, train, dev = classification
    at = []
    trainer = Trainer(model, train, opt, driver="numpy", n_epochs=2, evaluate_dataloaders=dev,
                      metrics={"acc": Accuracy()}, evaluate_every=4, progress_bar=None)
    trainer.add_callback_fn(Event.on_evaluate_end(), lambda t, r: at.append(t.global_forward_batches))
    trainer.run(num_eval_sanity_batch=0)
    assert at == [4, 8, 12, 16]  # 9 batches per epoch, 18 in all


def test_evaluate_every_callable(classification):
    model, opt, train, dev = classification
    at = []
    trainer = Trainer(model, train, opt, driver="numpy", n_epochs=1, evaluate_dataloaders=dev,
                      metrics={"acc": Accuracy()}, evaluate_every=lambda t: t.global_forward_batches in (2, 5),
                      progress_bar=None)
    trainer.add_callback_fn(Event.on_evaluate_end(), lambda t, r: at.append(t.global_forward_batches))
    trainer.run(num_eval_sanity_batch=0)
    assert at == [2, 5]


def test_evaluate_every_two_epochs(classification):
    model, opt, train, dev = classification
    at = []
    trainer = Trainer(model, train, opt, driver="numpy", n_epochs=5, evaluate_dataloaders=dev,
                      metrics={"acc": Accuracy()}, evaluate_every=-2, progress_bar=None)
    trainer.add_callback_fn(Event.on_evaluate_end(), lambda t, r: at.append(t.cur_epoch_idx))
    trainer.run(num_eval_sanity_batch=0)
    assert at == [2, 4]


def test_event_filters_every_once_and_filter_fn(regression):
    model, opt, loader = regression
    every, once, filtered = [], [], []
    trainer = Trainer(model, loader, opt, driver="numpy", n_epochs=2, progress_bar=None)
    trainer.add_callback_fn(Event.on_train_batch_end(every=3), lambda t: every.append(t.global_forward_batches))
    trainer.add_callback_fn(Event.on_train_batch_end(once=True), lambda t: once.append(t.global_forward_batches))
    trainer.add_callback_fn(Event.on_train_batch_end(filter_fn=lambda t: t.batch_idx_in_epoch == 8),
                            lambda t: filtered.append(t.cur_epoch_idx))
    trainer.run()
    assert every == [3, 6, 9, 12, 15]
    assert once == [1]
    assert filtered == [0, 1]


def test_trainer_on_decorator_and_marker(regression):
    model, opt, loader = regression
    calls = []

    @Trainer.on(Event.on_train_begin())
    def unmarked(trainer):
        calls.append(("unmarked", trainer.marker))

    @Trainer.on(Event.on_train_end(), marker="mine")
    def marked(trainer):
        calls.append(("marked", trainer.marker))

    Trainer(model, loader, opt, driver="numpy", n_epochs=1, marker="mine", progress_bar=None).run()
    Trainer(model, loader, opt, driver="numpy", n_epochs=1, marker="other", progress_bar=None).run()
    Trainer(model, loader, opt, driver="numpy", n_epochs=1, marker="mine", progress_bar=None).run()
    assert calls == [("unmarked", "mine"), ("marked", "mine"), ("marked", "mine")]
    Trainer._registered_fns.pop("mine", None)


def test_n_batches_overrides_epochs(regression):
    model, opt, loader = regression
    trainer = Trainer(model, loader, opt, driver="numpy", n_batches=11, progress_bar=None)
    trainer.run()
    assert trainer.global_forward_batches == 11
    # 8 batches per epoch: the epoch of index 1 stopped after 3, and stays the current one (a checkpoint now
    # resumes inside it)
    assert (trainer.cur_epoch_idx, trainer.batch_idx_in_epoch) == (1, 3)


def test_num_train_batch_per_epoch_truncates(regression):
    model, opt, loader = regression
    trainer = Trainer(model, loader, opt, driver="numpy", n_epochs=3, progress_bar=None)
    trainer.run(num_train_batch_per_epoch=2)
    assert trainer.global_forward_batches == 6


def test_iterable_without_len(regression):
    model, opt, loader = regression

    class Stream:
        def __iter__(self):
            return iter(loader)

    trainer = Trainer(model, Stream(), opt, driver="numpy", n_epochs=2, accumulation_steps=3, progress_bar=None)
    trainer.run()
    assert trainer.global_forward_batches == 16
    assert trainer.num_batches_per_epoch is None


def test_overfit_batches_reuses_the_same_batches(classification):
    model, opt, train, dev = classification
    seen = []
    trainer = Trainer(model, train, opt, driver="numpy", n_epochs=3, overfit_batches=2, metrics={"acc": Accuracy()},
                      progress_bar=None)
    trainer.add_callback_fn(Event.on_train_batch_begin(), lambda t, batch, idx: seen.append(batch["x"][0, 0]))
    trainer.run(num_eval_sanity_batch=0)
    assert len(seen) == 6
    assert seen[0:2] == seen[2:4] == seen[4:6]


def test_custom_batch_step_fn_uses_public_steps(regression):
    model, opt, loader = regression
    calls = []

    def step_fn(trainer, batch):
        outputs = trainer.train_step(batch)
        trainer.backward(outputs)
        trainer.step()
        trainer.zero_grad()
        calls.append(float(outputs["loss"]))

    before = mse(model, make_regression())
    Trainer(model, loader, opt, driver="numpy", n_epochs=3, batch_step_fn=step_fn, progress_bar=None).run()
    assert len(calls) == 24
    assert mse(model, make_regression()) < before


def test_train_fn_picks_a_named_method(regression):
    model, opt, loader = regression
    used = []

    def my_step(x, target):
        used.append(1)
        return model.forward(x, target)

    model.my_step = my_step
    Trainer(model, loader, opt, driver="numpy", n_epochs=1, train_fn="my_step", progress_bar=None).run()
    assert len(used) == 8


def test_input_and_output_mapping(regression):
    model, opt, loader = regression
    renamed = ArrayLoader({"features": loader.arrays["x"], "y": loader.arrays["target"]}, batch_size=8)

    def forward(x, target):
        out = LinearModel.forward(model, x, target)
        return {"objective": out["loss"], "pred": out["pred"]}

    model.forward = forward
    trainer = Trainer(model, renamed, opt, driver="numpy", n_epochs=1, progress_bar=None,
                      input_mapping={"features": "x", "y": "target"}, output_mapping={"objective": "loss"})
    trainer.run()
    assert trainer.global_forward_batches == 8


def test_early_stop_exception_ends_training_cleanly(regression):
    from drivetrain import EarlyStopException

    model, opt, loader = regression
    seen = []
    trainer = Trainer(model, loader, opt, driver="numpy", n_epochs=5, progress_bar=None)

    def stop(t):
        if t.global_forward_batches == 5:
            raise EarlyStopException("enough")

    trainer.add_callback_fn(Event.on_train_batch_end(), stop)
    trainer.add_callback_fn(Event.on_exception(), lambda t, e: seen.append(type(e).__name__))
    trainer.add_callback_fn(Event.on_train_end(), lambda t: seen.append("end"))
    trainer.run()
    assert trainer.global_forward_batches == 5
    assert seen == ["EarlyStopException", "end"]


def test_run_twice_is_an_error(regression):
    from drivetrain import ConfigurationError

    model, opt, loader = regression
    trainer = Trainer(model, loader, opt, driver="numpy", n_epochs=1, progress_bar=None)
    trainer.run()
    with pytest.raises(ConfigurationError, match="already called"):
        trainer.run()


def test_save_and_load_model_round_trip(regression, tmp_path):
    model, opt, loader = regression
    trainer = Trainer(model, loader, opt, driver="numpy", n_epochs=2, progress_bar=None)
    trainer.run()
    path = trainer.save_model(tmp_path / "best")
    assert path.endswith("model.safetensors")
    with open(path, "rb") as f:
        assert b"pickle" not in f.read(200)
    fresh = LinearModel(3, 1, seed=7)
    other = Trainer(fresh, loader, SGD(fresh.params, fresh.grads), driver="numpy", progress_bar=None)
    other.load_model(tmp_path / "best")
    np.testing.assert_array_equal(fresh.params["weight"], model.params["weight"])


def test_failed_save_keeps_previous_model_file(regression, tmp_path, monkeypatch):
    from drivetrain._format import folder as folder_module

    model, opt, loader = regression
    trainer = Trainer(model, loader, opt, driver="numpy", n_epochs=1, progress_bar=None)
    path = trainer.save_model(tmp_path / "best")
    with open(path, "rb") as f:
        original = f.read()
    model.params["weight"] += 1.0

    def half_write(p, content):  # content: bytes or a tensor file streamed from memory
        with open(p, "wb") as f:
            f.write(b"\x08\x00\x00\x00")  # a file cut short
        raise OSError("disk full")

    monkeypatch.setattr(folder_module, "_write_and_hash", half_write)
    with pytest.raises(OSError, match="disk full"):
        trainer.save_model(tmp_path / "best")
    with open(path, "rb") as f:
        assert f.read() == original
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best"]


def test_iterable_without_len_stops_on_n_batches(regression):
    model, opt, loader = regression

    class Stream:
        def __iter__(self):
            return iter(loader)

    trainer = Trainer(model, Stream(), opt, driver="numpy", n_batches=13, progress_bar="raw")
    trainer.run()
    assert trainer.global_forward_batches == 13
    assert trainer.n_epochs is None and trainer.cur_epoch_idx == 1


def test_rank_zero_only_function_callbacks_are_skipped_on_other_ranks():
    from drivetrain import rank_zero_only
    from drivetrain._callbacks.base import CallbackManager

    calls = []

    @rank_zero_only
    def on_zero(trainer):
        calls.append("zero")

    for zero in (True, False):
        manager = CallbackManager(is_global_zero=zero)
        manager.add_fn(Event.on_train_begin(), on_zero)
        manager.fire("on_train_begin", None)
    assert calls == ["zero"]


def test_accumulation_flushes_at_the_end_of_a_lenless_epoch_cut_by_n_batches(regression):
    model, opt, loader = regression

    class Stream:
        def __iter__(self):
            return iter(loader)  # 8 batches, no len

    steps = []
    trainer = Trainer(model, Stream(), opt, driver="numpy", n_batches=11, accumulation_steps=3, progress_bar=None)
    trainer.add_callback_fn(Event.on_after_optimizers_step(), lambda t, o: steps.append(t.global_forward_batches))
    trainer.add_callback_fn(Event.on_train_epoch_end(), lambda t: steps.append(("end", float(abs(model.grads["weight"]).sum()))))
    trainer.run()
    # steps fire during batches 3 and 6 (2 and 5 done before them); the data ends after 8 -> flushed
    assert steps[:3] == [2, 5, 8] and steps[3] == ("end", 0.0)
