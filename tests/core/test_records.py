"""Run records on the numpy driver: CSV and JSON-lines loggers, history, resume, broken loggers, bad input."""

from __future__ import annotations

import csv
import io
import json
import logging
import os
import sys

import numpy as np
import pytest

from drivetrain import (
    CallbackError,
    CheckpointCallback,
    ConfigurationError,
    Event,
    Trainer,
    hookimpl,
    seed_everything,
)
from drivetrain.backend._plugins import get_registry, register_plugin
from drivetrain.loggers import CSVLogger, JSONLinesLogger, Logger, logger_names
from drivetrain_numpy import SGD, ArrayLoader, LinearModel

from ._callback_helpers import make_trainer, stop_after
from .conftest import make_regression

EVERY = 5


def read_csv(path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def read_jsonl(path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f]


def losses_seen(trainer: Trainer) -> list[float]:
    """Every batch's loss, read independently of the recorder."""
    seen: list[float] = []
    trainer.add_callback_fn(Event.on_before_backward(),
                            lambda t, outputs: seen.append(float(np.mean(outputs["loss"]))))
    return seen


def test_csv_and_jsonl_hold_one_row_per_window_with_the_window_mean_loss(tmp_path) -> None:
    trainer = make_trainer(loggers=["csv", "jsonl"], log_every_n_steps=EVERY, run_dir=tmp_path, n_epochs=2)
    seen = losses_seen(trainer)
    trainer.run()
    rows = read_csv(tmp_path / "metrics.csv")
    lines = read_jsonl(tmp_path / "metrics.jsonl")
    steps = [int(row["step"]) for row in rows]
    assert steps == [5, 10, 15, 20, 25, 26] == [line["step"] for line in lines]  # 26 batches: the last window is short
    for row, line in zip(rows, lines, strict=True):
        first = [5, 10, 15, 20, 25, 26].index(line["step"])
        start = [0, 5, 10, 15, 20, 25][first]
        expected = float(np.mean(seen[start:line["step"]]))
        assert line["train/loss"] == pytest.approx(expected, rel=1e-6)
        assert float(row["train/loss"]) == pytest.approx(expected, rel=1e-6)
        assert line["train/lr"] == pytest.approx(0.05)
        assert line["train/samples_per_s"] > 0 and line["train/steps_per_s"] > 0
    assert trainer.history["train"] == [{**line, "epoch": trainer.history["train"][i]["epoch"]}
                                        for i, line in enumerate(lines)]
    hparams = json.loads((tmp_path / "hparams.json").read_text())
    assert hparams["n_epochs"] == 2 and hparams["world_size"] == 1 and "numpy" in hparams["driver"]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["step"] == 26
    assert summary["train/loss"] == lines[-1]["train/loss"]


def test_evaluations_are_logged_and_kept_in_history(tmp_path) -> None:
    trainer = make_trainer(loggers=[CSVLogger(tmp_path / "csv")], log_every_n_steps=EVERY,
                           run_dir=tmp_path / "run", script=lambda step: step / 100, evaluate_every=-1)
    trainer.run()
    rows = read_csv(tmp_path / "csv" / "metrics.csv")
    evaluated = [row for row in rows if row.get("eval/score#score")]
    assert [int(row["step"]) for row in evaluated] == [13, 26, 39]
    assert [float(row["eval/score#score"]) for row in evaluated] == [0.13, 0.26, 0.39]
    assert [(r["step"], r["score#score"]) for r in trainer.history["evaluate"]] == [(13, 0.13), (26, 0.26),
                                                                                      (39, 0.39)]
    assert not (tmp_path / "run").exists()  # the only logger writes to its own folder


def test_without_loggers_nothing_is_written_and_the_batch_path_is_untouched(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    trainer = make_trainer(script=lambda step: 1.0, evaluate_every=-1)
    handlers = trainer.callback_manager.handlers
    assert not handlers["on_before_backward"] and not handlers["on_train_batch_end"]
    trainer.run()
    assert os.listdir(tmp_path) == []
    assert trainer.history["train"] == [] and len(trainer.history["evaluate"]) == 3


def test_log_every_n_steps_alone_fills_the_history(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    trainer = make_trainer(log_every_n_steps=13, n_epochs=2)
    trainer.run()
    assert [row["step"] for row in trainer.history["train"]] == [13, 26]
    assert os.listdir(tmp_path) == []  # no logger: no run folder either


def test_a_resumed_run_continues_the_record_without_duplicates(tmp_path) -> None:
    seed_everything(0)
    reference = make_trainer(loggers=["jsonl"], log_every_n_steps=EVERY, run_dir=tmp_path / "ref")
    reference.run()

    seed_everything(0)
    first = make_trainer([CheckpointCallback(tmp_path / "ckpt", every_n_batches=12)], loggers=["jsonl"],
                         log_every_n_steps=EVERY, run_dir=tmp_path / "run")
    stop_after(first, 23)  # the checkpoint is at step 12; the failed run logs its last, short window too
    with pytest.raises(CallbackError):
        first.run()
    assert [row["step"] for row in read_jsonl(tmp_path / "run" / "metrics.jsonl")] == [5, 10, 15, 20, 23]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["status"] == "failed"

    seed_everything(3)
    resumed = make_trainer([CheckpointCallback(tmp_path / "ckpt", every_n_batches=12)], loggers=["jsonl"],
                           log_every_n_steps=EVERY)  # no run_dir: the checkpoint's record is continued
    resumed.run(resume_from=tmp_path / "ckpt")
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    expected = read_jsonl(tmp_path / "ref" / "metrics.jsonl")
    assert [row["step"] for row in rows] == [row["step"] for row in expected]
    # the window that straddles the resume (steps 11-15) is measured from the resume on, so only its loss
    # differs; every window before the checkpoint and after the resume matches the unbroken run exactly
    for row, ref in zip(rows, expected, strict=True):
        if row["step"] != 15:
            assert row["train/loss"] == pytest.approx(ref["train/loss"], rel=1e-6), row["step"]
    assert [r["step"] for r in resumed.history["train"]] == [row["step"] for row in expected]


class Broken(Logger):
    name = "broken"

    def log_scalars(self, scalars, step) -> None:
        raise OSError("disk full")


def test_a_logger_that_raises_is_named_and_left_out_while_training_and_checkpoints_go_on(tmp_path) -> None:
    trainer = make_trainer([CheckpointCallback(tmp_path / "ckpt", every_n_batches=13)],
                           loggers=[Broken(), "csv"], log_every_n_steps=EVERY, run_dir=tmp_path / "run")
    with pytest.warns(RuntimeWarning, match=r"logger 'broken' \(Broken\) raised in log_scalars\(\): OSError: disk full"):
        trainer.run()
    assert trainer.global_forward_batches == 39
    assert len(read_csv(tmp_path / "run" / "metrics.csv")) == 8
    assert sorted(os.listdir(tmp_path / "ckpt"))[-1] == "step_00000039-epoch_3-batch_0"


@pytest.mark.parametrize(("kwargs", "fragment"), [
    ({"loggers": ["cvs"]}, r"loggers=\['cvs'\]: no logger of that name. Did you mean 'csv'"),
    ({"loggers": [object()]}, "object is not a logger"),
    ({"loggers": 3}, "loggers=3 is not accepted"),
    ({"log_every_n_steps": 0}, "log_every_n_steps=0"),
    ({"log_every_n_steps": "10"}, "log_every_n_steps='10'"),
    ({"run_dir": 5}, "run_dir=5"),
])
def test_bad_record_arguments_name_the_argument(kwargs, fragment) -> None:
    with pytest.raises(ConfigurationError, match=fragment):
        make_trainer(**kwargs)


def test_a_plugin_adds_a_logger_by_name(tmp_path) -> None:
    class Plugin:
        @hookimpl
        def drivetrain_loggers(self) -> dict[str, str]:
            return {"rows": "drivetrain.loggers:JSONLinesLogger"}

    plugin = Plugin()
    register_plugin(plugin, name="rows-plugin")
    try:
        assert logger_names()["rows"] == "drivetrain.loggers:JSONLinesLogger"
        trainer = make_trainer(loggers=["rows"], log_every_n_steps=13, run_dir=tmp_path, n_epochs=1)
        trainer.run()
        assert [row["step"] for row in read_jsonl(tmp_path / "metrics.jsonl")] == [13]
    finally:
        get_registry().manager.unregister(plugin)


def test_a_logger_object_rejects_a_bad_save_dir() -> None:
    with pytest.raises(ConfigurationError, match=r"JSONLinesLogger\(save_dir=3\)"):
        JSONLinesLogger(3)


def tensorboard_scalars(folder) -> dict[str, list[tuple[int, float]]]:
    """The scalars of the event files in ``folder``, read by TensorBoard's own reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(folder))
    accumulator.Reload()
    return {tag: [(event.step, event.value) for event in accumulator.Scalars(tag)]
            for tag in accumulator.Tags()["scalars"]}


def test_tensorboard_events_read_back_with_tensorboards_reader_and_a_resume_purges_the_crashed_tail(tmp_path) -> None:
    pytest.importorskip("tensorboardX")
    pytest.importorskip("tensorboard")
    first = make_trainer([CheckpointCallback(tmp_path / "ckpt", every_n_batches=12)], loggers=["tensorboard", "jsonl"],
                         log_every_n_steps=EVERY, run_dir=tmp_path / "run", script=lambda step: step / 100,
                         evaluate_every=-1)
    stop_after(first, 23)
    with pytest.raises(CallbackError):
        first.run()
    resumed = make_trainer([CheckpointCallback(tmp_path / "ckpt", every_n_batches=12)], loggers=["tensorboard", "jsonl"],
                           log_every_n_steps=EVERY, script=lambda step: step / 100, evaluate_every=-1)
    resumed.run(resume_from=tmp_path / "ckpt")
    scalars = tensorboard_scalars(tmp_path / "run" / "tensorboard")
    lines = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    train = [line for line in lines if "train/loss" in line]
    assert [step for step, _ in scalars["train/loss"]] == [line["step"] for line in train]
    assert [value for _, value in scalars["train/loss"]] == pytest.approx([line["train/loss"] for line in train])
    # TensorBoard tag names cannot hold "#": tensorboardX writes eval/score_score
    assert scalars["eval/score_score"] == [(13, pytest.approx(0.13)), (26, pytest.approx(0.26)), (39, pytest.approx(0.39))]


def test_drivetrain_plot_draws_several_runs_into_one_picture(tmp_path, capsys) -> None:
    pytest.importorskip("matplotlib")
    from matplotlib.image import imread

    from drivetrain._cli import main

    for name, lr, logger in (("a", 0.05, "jsonl"), ("b", 0.01, "csv")):
        make_trainer(loggers=[logger], log_every_n_steps=EVERY, run_dir=tmp_path / name, lr=lr,
                     script=lambda step: step / 100, evaluate_every=-1).run()
    out = tmp_path / "curves.png"
    capsys.readouterr()
    assert main(["plot", str(tmp_path / "a"), str(tmp_path / "b"), "-o", str(out)]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {out}"
    image = imread(out)
    assert image.shape[0] > 200 and image.shape[1] > 600  # three panels: loss, lr, eval/score

    assert main(["plot", str(tmp_path), "-o", str(out)]) == 1
    assert "holds no run record (metrics.jsonl or metrics.csv)" in capsys.readouterr().err


def test_drivetrains_messages_go_through_the_drivetrain_logger_at_the_chosen_level(tmp_path, caplog) -> None:
    caplog.set_level(logging.DEBUG)
    make_trainer(loggers=["jsonl"], log_every_n_steps=13, run_dir=tmp_path / "a", n_epochs=1).run()
    said = [r.getMessage() for r in caplog.records if r.name == "drivetrain"]
    assert said == [f"recording the run with jsonl in {tmp_path / 'a' / 'metrics.jsonl'}"]
    caplog.clear()
    make_trainer(loggers=["jsonl"], log_every_n_steps=13, run_dir=tmp_path / "b", n_epochs=1,
                 log_level="warning").run()
    assert [r for r in caplog.records if r.name == "drivetrain"] == []
    with pytest.raises(ConfigurationError, match=r"log_level='loud' is not accepted; pass one of \['debug', 'info'"):
        make_trainer(log_level="loud")


def test_the_default_handler_writes_to_the_stderr_of_the_moment(monkeypatch) -> None:
    """A live progress bar swaps sys.stderr to draw messages above its bars: the handler follows the swap."""
    from drivetrain._common.log import _CurrentStderr

    handler = _CurrentStderr()
    handler.setFormatter(logging.Formatter("drivetrain: %(message)s"))
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    handler.emit(logging.LogRecord("drivetrain", logging.INFO, __file__, 1, "hello %s", ("there",), None))
    assert stream.getvalue() == "drivetrain: hello there\n"


def test_a_csv_row_cut_short_by_a_crash_is_not_read_back(tmp_path) -> None:
    logger = CSVLogger(tmp_path)
    (tmp_path / "metrics.csv").write_text("step,train/loss\n5,0.5\n10,0.25\n2")  # "25,0.125" cut by kill -9
    logger.open(str(tmp_path), resume_step=20)
    assert logger.rows == [{"step": 5, "train/loss": 0.5}, {"step": 10, "train/loss": 0.25}]
    assert read_csv(tmp_path / "metrics.csv") == [{"step": "5", "train/loss": "0.5"}, {"step": "10", "train/loss": "0.25"}]


def test_an_evaluation_after_run_goes_to_the_history_not_to_the_closed_record(tmp_path) -> None:
    trainer = make_trainer(loggers=["jsonl"], log_every_n_steps=13, run_dir=tmp_path, n_epochs=1,
                           script=lambda step: 0.5, evaluate_every=-1)
    trainer.run()
    before = read_jsonl(tmp_path / "metrics.jsonl")
    trainer.evaluate()
    assert read_jsonl(tmp_path / "metrics.jsonl") == before
    assert [row["step"] for row in trainer.history["evaluate"]] == [13, 13]


def test_grad_norm_is_the_window_mean_of_the_norms_clipping_computed(tmp_path) -> None:
    trainer = make_trainer(log_every_n_steps=4, n_epochs=1, accumulation_steps=2, grad_clip=1e-3)
    norms: list[float] = []

    def before_step(t: Trainer, optimizers) -> None:  # the gradients the driver is about to clip
        norms.append(float(np.sqrt(sum(float((g ** 2).sum()) for g in t.driver.model.grads.values()))))

    trainer.add_callback_fn(Event.on_before_optimizers_step(), before_step)
    trainer.run()
    rows = trainer.history["train"]
    assert [row["step"] for row in rows] == [4, 8, 12, 13]
    # 13 batches, a step every 2 (and one for the last, odd batch): steps after batches 2, 4, ..., 12, 13
    expected = [np.mean(norms[0:2]), np.mean(norms[2:4]), np.mean(norms[4:6]), norms[6]]
    assert [row["train/grad_norm"] for row in rows] == pytest.approx(expected, rel=1e-6)
    assert max(norms) > 1e-3  # clipping was active


def test_no_grad_norm_without_norm_clipping_and_tokens_from_a_declared_count(tmp_path) -> None:
    trainer = make_trainer(log_every_n_steps=13, n_epochs=1, grad_clip=0.5, grad_clip_type="value")
    trainer.run()
    assert "train/grad_norm" not in trainer.history["train"][0]

    class Counted:  # batches that declare their token count: 7 tokens per sample
        def __init__(self, loader) -> None:
            self.loader = loader

        def __iter__(self):
            for batch in self.loader:
                yield {**batch, "num_tokens": 7 * len(batch["x"])}

        def __len__(self) -> int:
            return len(self.loader)

    model = LinearModel(3, 1, seed=0)
    loader = Counted(ArrayLoader(make_regression(n=50), batch_size=4))
    trainer = Trainer(model, loader, SGD(model.params, model.grads, lr=0.05), driver="numpy", n_epochs=1,
                      log_every_n_steps=13, progress_bar=None)
    trainer.run()
    row = trainer.history["train"][0]
    assert row["train/tokens_per_s"] == pytest.approx(7 * row["train/samples_per_s"], rel=1e-9)
