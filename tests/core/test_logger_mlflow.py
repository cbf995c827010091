"""The MLflow logger on the numpy driver, read back with MLflow's own client (``MlflowClient``)."""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import subprocess
import sys

import pytest

from drivetrain import CallbackError, CheckpointCallback, ConfigurationError, seed_everything
from drivetrain._records import registry
from drivetrain._records.mlflow_logger import MLflowLogger

from ._callback_helpers import make_trainer, stop_after

pytestmark = pytest.mark.timeout(120)
EVERY = 5
TRAIN = ("train/loss", "train/lr", "train/steps_per_s", "train/samples_per_s")


@pytest.fixture(autouse=True)
def _offline_mlflow(monkeypatch) -> None:
    """A store of the test's own, and no usage telemetry sent from the tests (the machine is offline)."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_ENABLE_ASYNC_LOGGING", raising=False)
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")


@pytest.fixture
def by_name(monkeypatch) -> None:
    """``loggers=["mlflow"]``, whether or not the registry lists it yet."""
    monkeypatch.setitem(registry.BUILT_IN, "mlflow", "drivetrain._records.mlflow_logger:MLflowLogger")


def client_of(folder):
    """MLflow's client on the store an MLflowLogger wrote in ``folder``, and that logger's run id."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{(folder / 'mlflow.db').resolve().as_posix()}"
    return MlflowClient(tracking_uri=uri), json.loads((folder / "run.json").read_text())["run_id"]


def history(client, run_id: str, key: str) -> list[tuple[int, float]]:
    return [(m.step, m.value) for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)]


def read_csv(path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_scalars_params_evaluations_and_status_read_back_with_mlflows_client(tmp_path) -> None:
    pytest.importorskip("mlflow")
    trainer = make_trainer(loggers=[MLflowLogger(tmp_path / "ml", run_name="first", tags={"team": "core"}), "csv"],
                           log_every_n_steps=EVERY, run_dir=tmp_path / "run", script=lambda step: step / 100,
                           evaluate_every=-1)
    trainer.run()
    client, run_id = client_of(tmp_path / "ml")
    run = client.get_run(run_id)
    rows = read_csv(tmp_path / "run" / "metrics.csv")
    train = [row for row in rows if row.get("train/loss")]
    for key in TRAIN:
        assert history(client, run_id, key) == [(int(row["step"]), pytest.approx(float(row[key]), rel=1e-12))
                                                for row in train], key
    # '#' is not an MLflow key character: eval/score#score is logged as eval/score_score
    assert history(client, run_id, "eval/score_score") == [(13, pytest.approx(0.13)), (26, pytest.approx(0.26)),
                                                           (39, pytest.approx(0.39))]
    assert run.info.status == "FINISHED" and run.info.run_name == "first"
    params = run.data.params
    assert params["n_epochs"] == "3" and params["world_size"] == "1" and "numpy" in params["driver"]
    assert params["optimizers"] == "['SGD']" and params["grad_clip"] == "None"
    tags = run.data.tags
    assert tags["team"] == "core" and tags["drivetrain.status"] == "finished"
    assert tags["drivetrain.summary.step"] == "39" and float(tags["drivetrain.summary.seconds"]) > 0
    assert float(tags["drivetrain.summary.score_score"]) == pytest.approx(0.39)
    assert sorted(os.listdir(tmp_path / "ml")) == ["mlflow.db", "run.json"]  # no artifacts logged: no folder made


def test_a_resumed_run_holds_each_step_once_and_points_to_the_run_it_continues(tmp_path, by_name) -> None:
    pytest.importorskip("mlflow")

    def trainer(**kwargs):
        return make_trainer([CheckpointCallback(tmp_path / "ckpt", every_n_batches=12)], loggers=["mlflow", "jsonl"],
                            log_every_n_steps=EVERY, script=lambda step: step / 100, evaluate_every=-1, **kwargs)

    seed_everything(0)
    first = trainer(run_dir=tmp_path / "run")
    stop_after(first, 23)  # the checkpoint is at step 12; the crashed run logs steps 15, 20, 23 past it
    with pytest.raises(CallbackError):
        first.run()
    client, crashed_id = client_of(tmp_path / "run" / "mlflow")  # by name: under the run folder's mlflow/
    assert [step for step, _ in history(client, crashed_id, "train/loss")] == [5, 10, 15, 20, 23]
    assert client.get_run(crashed_id).info.status == "FAILED"

    seed_everything(3)
    trainer().run(resume_from=tmp_path / "ckpt")  # no run_dir: the checkpoint's record is continued
    client, run_id = client_of(tmp_path / "run" / "mlflow")
    assert run_id != crashed_id
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [line for line in lines if "train/loss" in line]
    for key in TRAIN:
        assert history(client, run_id, key) == [(line["step"], pytest.approx(line[key], rel=1e-12))
                                                for line in train], key
    assert [step for step, _ in history(client, run_id, "train/loss")] == [5, 10, 15, 20, 25, 30, 35, 39]
    assert history(client, run_id, "eval/score_score") == [(13, pytest.approx(0.13)), (26, pytest.approx(0.26)),
                                                           (39, pytest.approx(0.39))]
    run, crashed = client.get_run(run_id), client.get_run(crashed_id)
    assert run.info.status == "FINISHED" and run.info.run_name == crashed.info.run_name
    assert run.data.tags["drivetrain.resumed_from"] == crashed_id and run.data.tags["drivetrain.resume_step"] == "12"
    assert crashed.data.tags["drivetrain.resumed_by"] == run_id and crashed.info.status == "FAILED"
    assert run.data.params["n_epochs"] == "3"


def test_a_run_killed_without_close_is_marked_killed_and_a_resume_without_a_record_starts_fresh(tmp_path) -> None:
    pytest.importorskip("mlflow")
    crashed = MLflowLogger()
    crashed.open(str(tmp_path), None)  # no save_dir: the run folder's mlflow/
    crashed.log_hyperparams({"lr": 0.1})
    for step in (5, 10, 15):
        crashed.log_scalars({"train/loss": step / 10}, step)
    crashed.flush()  # then kill -9: no close()
    client, crashed_id = client_of(tmp_path / "mlflow")
    assert client.get_run(crashed_id).info.status == "RUNNING"

    resumed = MLflowLogger()
    resumed.open(str(tmp_path), resume_step=10)
    resumed.log_hyperparams({"lr": 0.2})  # a changed configuration: params belong to the new run, no conflict
    resumed.log_scalars({"train/loss": 0.5}, 15)
    resumed.close("finished", {"step": 15})
    client, run_id = client_of(tmp_path / "mlflow")
    assert history(client, run_id, "train/loss") == [(5, 0.5), (10, 1.0), (15, 0.5)]
    assert client.get_run(crashed_id).info.status == "KILLED"
    assert client.get_run(run_id).data.params == {"lr": "0.2"}

    (tmp_path / "mlflow" / "run.json").unlink()
    fresh = MLflowLogger()
    fresh.open(str(tmp_path), resume_step=10)  # the record of the run it continues is gone: a run of its own
    fresh.close("stopped", {})
    client, fresh_id = client_of(tmp_path / "mlflow")
    run = client.get_run(fresh_id)
    assert fresh_id not in (run_id, crashed_id) and "drivetrain.resumed_from" not in run.data.tags
    assert run.data.tags["drivetrain.resume_step"] == "10" and run.info.status == "KILLED"
    assert client.get_metric_history(fresh_id, "train/loss") == []


def test_keys_mlflow_refuses_are_rewritten_and_long_values_cut(tmp_path) -> None:
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{(tmp_path / 'elsewhere.db').as_posix()}"
    logger = MLflowLogger(tmp_path / "ml", tracking_uri=uri, experiment="odd keys")
    logger.open(str(tmp_path / "run"), None)
    logger.log_hyperparams({"model": {"layers": [8, 4], "act": {"name": "relu"}}, "empty": {}, "note": "x" * 7000,
                            "ratio:a#b": 0.5, "/lead//double/./dot/": True})
    logger.log_scalars({"eval/acc#acc#dev": 0.75, "a/../b": 1.0, "": 2.0, "ok key-1.2/x_y": 3.0,
                        "train/loss": float("nan")}, 7)  # a diverged loss is recorded as such
    logger.close("failed", {"note": "y" * 9000})
    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(logger.run_id)
    assert run.data.params == {"model/layers": "[8, 4]", "model/act/name": "relu", "empty": "{}",
                               "note": "x" * 5997 + "...", "ratio_a_b": "0.5", "lead/double/_/dot": "True"}
    loss = run.data.metrics.pop("train/loss")
    assert loss != loss and run.data.metrics == {"eval/acc_acc_dev": 0.75, "a/_/b": 1.0, "_": 2.0,
                                                 "ok key-1.2/x_y": 3.0}
    assert run.info.status == "FAILED" and run.data.tags["drivetrain.summary.note"] == "y" * 7997 + "..."
    assert client.get_experiment(run.info.experiment_id).name == "odd keys"
    assert sorted(os.listdir(tmp_path / "ml")) == ["run.json"]  # another store: the folder holds the run id only
    assert not (tmp_path / "run").exists()


def test_with_asynchronous_logging_flush_waits_for_the_writes(tmp_path, monkeypatch) -> None:
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_ENABLE_ASYNC_LOGGING", "true")
    logger = MLflowLogger(tmp_path)
    logger.open(str(tmp_path), None)
    for step in range(1, 21):
        logger.log_scalars({"train/loss": 1 / step}, step)
    logger.flush()
    client, run_id = client_of(tmp_path)
    assert [step for step, _ in history(client, run_id, "train/loss")] == list(range(1, 21))
    logger.close("finished", {})
    assert client.get_run(run_id).info.status == "FINISHED"


def test_a_missing_dependency_names_the_install_line(monkeypatch, by_name) -> None:
    if importlib.util.find_spec("mlflow") is not None:  # the local store needs sqlalchemy; a tracking server does not
        monkeypatch.setitem(sys.modules, "sqlalchemy", None)
        with pytest.raises(ConfigurationError, match="needs sqlalchemy"):
            MLflowLogger()
        assert MLflowLogger(tracking_uri="http://localhost:5000").tracking_uri == "http://localhost:5000"
    monkeypatch.setitem(sys.modules, "mlflow", None)
    with pytest.raises(ConfigurationError, match=r"needs mlflow(, sqlalchemy)?(, alembic)?, which (is|are) not installed: pip "
                                                 r"install mlflow-skinny sqlalchemy alembic \(or, from a drivetrain checkout, pip install -e \"\.\[mlflow\]\"\)"):
        MLflowLogger()
    with pytest.raises(ConfigurationError, match=r"the 'mlflow' logger needs mlflow"):
        make_trainer(loggers=["mlflow"])


@pytest.mark.parametrize(("kwargs", "fragment"), [
    ({"save_dir": 3}, r"MLflowLogger\(save_dir=3\)"),
    ({"tracking_uri": ""}, r"MLflowLogger\(tracking_uri=''\): pass a tracking URI"),
    ({"experiment": " "}, r"MLflowLogger\(experiment=' '\): pass the experiment's name"),
    ({"run_name": 5}, r"MLflowLogger\(run_name=5\)"),
    ({"tags": ["a"]}, r"MLflowLogger\(tags=\['a'\]\): pass a dict"),
])
def test_bad_arguments_name_the_argument(kwargs, fragment) -> None:
    with pytest.raises(ConfigurationError, match=fragment):
        MLflowLogger(**kwargs)


def test_importing_drivetrain_or_making_the_logger_does_not_import_mlflow() -> None:
    pytest.importorskip("mlflow")
    code = ("import sys, drivetrain, drivetrain.loggers\n"
            "from drivetrain._records.mlflow_logger import MLflowLogger\n"
            "MLflowLogger(); MLflowLogger(tracking_uri='http://localhost:5000')\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('mlflow', 'sqlalchemy', 'alembic')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"
