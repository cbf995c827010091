"""The VisualDL logger on a real paddle run, read back with VisualDL's own reader and compared with the CSV record."""

from __future__ import annotations

import os
import sys

import pytest

from drivetrain import Accuracy, CallbackError, CheckpointCallback, ConfigurationError, Event, Trainer
from drivetrain._records import registry
from drivetrain._records.files import read_csv_rows
from drivetrain.loggers import CSVLogger

from .conftest import TinyNet, paddle, separable

pytest.importorskip("visualdl")

from drivetrain._records.visualdl_logger import VisualDLLogger, newest_record_file, read_scalars  # noqa: E402

pytestmark = pytest.mark.timeout(120)
EVERY = 5
TARGET = "drivetrain._records.visualdl_logger:VisualDLLogger"


class Stop(Exception):
    """Raised by a test handler to end a run after a given batch, as a crash would."""


def make_trainer(loggers, callbacks=None, evaluate: bool = True, **kwargs) -> Trainer:
    """TinyNet on 8 batches per epoch, evaluated (``acc#acc``) after every epoch unless ``evaluate`` is False."""
    paddle.seed(0)
    model = TinyNet()
    x, y = separable(160)
    train = [{"x": x[i:i + 16], "y": y[i:i + 16]} for i in range(0, 128, 16)]
    dev = [{"x": x[i:i + 16], "y": y[i:i + 16], "target": y[i:i + 16]} for i in range(128, 160, 16)]
    optimizer = paddle.optimizer.SGD(learning_rate=0.5, parameters=model.parameters())
    if evaluate:
        kwargs.update(evaluate_dataloaders=dev, metrics={"acc": Accuracy()}, output_mapping={"logits": "pred"})
    return Trainer(model, train, optimizer, driver="paddle", n_epochs=3, progress_bar=None, loggers=loggers,
                   log_every_n_steps=EVERY, callbacks=callbacks, **kwargs)


def visualdl_scalars(folder) -> dict[str, list[tuple[int, float]]]:
    """The scalars VisualDL shows for ``folder``: the file its ``LogReader`` picks, read by VisualDL's reader."""
    from visualdl import LogReader

    picked = LogReader(logdir=str(folder)).logs()
    assert list(picked) == [str(folder)]  # one run: sub-folders or set-aside files would show as more
    reader = LogReader(file_path=os.path.join(str(folder), picked[str(folder)]))
    return {tag: [(record.id, record.value) for record in reader.get_data("scalar", tag)]
            for tag in reader.get_tags()["scalar"]}


def csv_scalars(folder) -> dict[str, list[tuple[int, float]]]:
    """The same series from ``metrics.csv``, under the names VisualDL gives them."""
    series: dict[str, list[tuple[int, float]]] = {}
    for row in read_csv_rows(os.path.join(folder, "metrics.csv")):
        for name, value in row.items():
            if name not in ("step", "epoch"):
                series.setdefault(name.replace("#", "_"), []).append((int(row["step"]), value))
    return series


def assert_same_series(seen: dict, expected: dict) -> None:
    assert sorted(seen) == sorted(expected)
    for tag, points in expected.items():
        assert [step for step, _ in seen[tag]] == [step for step, _ in points], tag
        assert [value for _, value in seen[tag]] == pytest.approx([value for _, value in points], rel=1e-6), tag


def texts(folder, tag: str) -> list[tuple[int, str]]:
    from visualdl import LogReader

    reader = LogReader(file_path=newest_record_file(str(folder)))
    return [(record.id, record.text.encoded_text_string) for record in reader.get_data("text", tag)]


def test_a_paddle_run_reads_back_in_visualdl_as_in_the_csv_record(tmp_path) -> None:
    trainer = make_trainer([VisualDLLogger(tmp_path / "vdl"), CSVLogger(tmp_path / "csv")])
    trainer.run(num_eval_sanity_batch=0)
    seen = visualdl_scalars(tmp_path / "vdl")
    assert [step for step, _ in seen["train/loss"]] == [5, 10, 15, 20, 24]
    assert [step for step, _ in seen["eval/acc_acc"]] == [8, 16, 24]  # '#' is not kept in a tag
    assert_same_series(seen, csv_scalars(tmp_path / "csv"))

    from visualdl import LogReader
    from visualdl.server import lib

    # the dashboard's own view: the HyperParameters tab lists the configuration with the last train/loss
    (listed,) = lib.get_hparam_list(LogReader(logdir=str(tmp_path / "vdl")))
    assert listed["hparams"]["n_epochs"] == 3 and listed["hparams"]["optimizers"] == '["SGD"]'
    assert listed["hparams"]["driver"].startswith("paddle")
    assert listed["metrics"]["train/loss"] == pytest.approx(seen["train/loss"][-1][1])
    assert texts(tmp_path / "vdl", "status") == [(24, "finished")]
    assert '"log_every_n_steps": 5' in texts(tmp_path / "vdl", "hparams")[0][1]


def test_a_resumed_paddle_run_shows_every_step_once(tmp_path) -> None:
    def run(resume: bool) -> Trainer:
        trainer = make_trainer([VisualDLLogger(tmp_path / "vdl"), CSVLogger(tmp_path / "csv")],
                               [CheckpointCallback(tmp_path / "ckpt", every_n_batches=8)])  # at epoch ends
        if not resume:
            trainer.add_callback_fn(Event.on_train_batch_end(),
                                    lambda t: _raise(Stop()) if t.global_forward_batches == 13 else None)
        return trainer

    with pytest.raises(CallbackError):
        run(resume=False).run(num_eval_sanity_batch=0)
    crashed = newest_record_file(str(tmp_path / "vdl"))
    first = visualdl_scalars(tmp_path / "vdl")
    assert [step for step, _ in first["train/loss"]] == [5, 10, 13]  # the checkpoint is at step 8
    assert texts(tmp_path / "vdl", "status") == [(13, "failed")]

    run(resume=True).run(resume_from=tmp_path / "ckpt", num_eval_sanity_batch=0)
    seen = visualdl_scalars(tmp_path / "vdl")
    assert [step for step, _ in seen["train/loss"]] == [5, 10, 15, 20, 24]
    assert [step for step, _ in seen["eval/acc_acc"]] == [8, 16, 24]
    assert_same_series(seen, csv_scalars(tmp_path / "csv"))
    for tag in first:  # the points up to the checkpoint are the first session's, copied as written
        kept = [point for point in first[tag] if point[0] <= 8]
        assert seen[tag][:len(kept)] == kept
    # the crashed session's file is set aside under a name VisualDL does not read, with all it held
    assert not os.path.exists(crashed)
    aside = os.path.join(os.path.dirname(crashed), os.path.basename(crashed).replace("vdlrecords", "superseded"))
    assert [(step, value) for tag, value, step, _ in read_scalars(aside) if tag == "train/loss"] == first["train/loss"]
    assert texts(tmp_path / "vdl", "status") == [(24, "finished")]
    assert len(texts(tmp_path / "vdl", "hparams")) == 1


def test_a_record_cut_short_by_a_crash_is_not_carried_over(tmp_path) -> None:
    logger = VisualDLLogger(tmp_path)
    logger.open(str(tmp_path), None)
    for step in range(1, 7):
        logger.log_scalars({"train/loss": step / 10}, step)
    logger.close_writer()  # killed: no close(), but what was flushed is on disk
    with open(newest_record_file(str(tmp_path)), "ab") as f:
        f.write((100).to_bytes(8, "little") + b"\x0a\x05half")  # the length of a record the crash cut short
    resumed = VisualDLLogger(tmp_path)
    resumed.open(str(tmp_path), resume_step=4)
    for step in range(5, 8):
        resumed.log_scalars({"train/loss": step}, step)
    resumed.close("finished", {"step": 7})
    (steps, values) = zip(*visualdl_scalars(tmp_path)["train/loss"], strict=True)
    assert steps == (1, 2, 3, 4, 5, 6, 7)
    assert values == pytest.approx([0.1, 0.2, 0.3, 0.4, 5.0, 6.0, 7.0])
    assert sorted(name.split(".")[0] for name in os.listdir(tmp_path)) == ["superseded", "vdlrecords"]


def test_the_name_visualdl_writes_under_the_run_folder(tmp_path, monkeypatch) -> None:
    monkeypatch.setitem(registry.BUILT_IN, "visualdl", TARGET)  # a no-op once registry.py names it
    assert registry.BUILT_IN["visualdl"] == TARGET
    trainer = make_trainer(["visualdl"], run_dir=tmp_path / "run", evaluate=False)
    trainer.run(num_train_batch_per_epoch=2)
    assert [step for step, _ in visualdl_scalars(tmp_path / "run" / "visualdl")["train/loss"]] == [5, 6]


def test_a_missing_visualdl_names_the_install_line(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "visualdl", None)  # what an environment without it raises
    with pytest.raises(ConfigurationError, match=r"the 'visualdl' logger needs visualdl, which is not installed: "
                                                 r"pip install visualdl \(or, from a drivetrain checkout, pip install -e \"\.\[visualdl\]\"\)"):
        VisualDLLogger()


def _raise(exc: BaseException) -> None:
    raise exc
