"""MLflow tracking runs, written with ``MlflowClient`` (``mlflow-skinny`` is enough; no server needed).

By default the run goes to a SQLite tracking store in the run folder's ``mlflow/mlflow.db``:
MLflow 3.17 refuses its file store (``./mlruns``) unless ``MLFLOW_ALLOW_FILE_STORE=true`` is
set, and its database store needs ``sqlalchemy`` and ``alembic``, which ``mlflow-skinny``
leaves out. Each logged step is one ``log_batch`` call, written synchronously, so
:meth:`MLflowLogger.flush` has nothing to push unless MLflow's asynchronous logging is
switched on (``MLFLOW_ENABLE_ASYNC_LOGGING=true``); then it waits for the queued writes.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from .._common import ConfigurationError
from .files import write_json
from .logger import Logger, require_modules

INSTALL = 'pip install mlflow-skinny sqlalchemy alembic (or, from a drivetrain checkout, pip install -e ".[mlflow]")'
RUN_FILE = "run.json"
"""In the logger's folder: the MLflow run a resumed run continues (``{"run_id": ..., ...}``)."""
DB_FILE = "mlflow.db"

_STATUS = {"finished": "FINISHED", "stopped": "KILLED", "failed": "FAILED"}
_NOT_IN_KEYS = re.compile(r"[^-/\w\. ]")  # MLflow's key characters (less ':', which Windows stores refuse)
_MAX_KEY = 250  # MLflow's limits on key and value lengths, and on the entries of one log_batch call
_MAX_PARAM_VALUE = 6000
_MAX_TAG_VALUE = 8000
_MAX_METRICS_PER_CALL = 1000
_MAX_PARAMS_PER_CALL = 100
_DATABASE_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql")


class MLflowLogger(Logger):
    """Parameters, scalars and evaluations as one MLflow run per (resumed) run of the Trainer.

    ``save_dir`` is the logger's folder (default: the run folder's ``mlflow/``): it holds the
    SQLite store ``mlflow.db`` and ``run.json``, the id of the MLflow run. ``tracking_uri``
    names another store or a tracking server (``http://host:5000``, ``sqlite:///path.db``,
    ``databricks``); the environment's ``MLFLOW_TRACKING_URI`` is used when it is None.
    Then the folder keeps only ``run.json``. ``experiment`` is the experiment's name (made if
    missing), ``run_name`` the run's (MLflow picks one if None), ``tags`` extra run tags.

    The configuration is logged as params (nested keys joined with ``/``, values as strings,
    cut at MLflow's 6000 characters). Key characters MLflow does not accept become ``_``
    (``eval/acc#acc`` is logged as ``eval/acc_acc``); NaN is kept, MLflow stores infinities as the
    largest float. ``close`` sets the run status (finished: FINISHED, stopped: KILLED, failed:
    FAILED) and tags the summary as ``drivetrain.summary.<name>``. View a local store with
    ``mlflow ui --backend-store-uri sqlite:///RUN_DIR/mlflow/mlflow.db`` (the UI needs the full
    ``mlflow`` package).

    Resuming: MLflow keeps a metric's history append-only and has no call that deletes points,
    so what the crashed run logged after its checkpoint cannot be dropped from it. A resumed run
    (``open`` with a ``resume_step``) therefore starts a new MLflow run that continues the one
    ``run.json`` names: it copies that run's points up to the checkpoint (timestamps kept), takes
    its run name, is tagged ``drivetrain.resumed_from=<old id>`` and ``drivetrain.resume_step``,
    and becomes the run ``run.json`` names. The crashed run is tagged ``drivetrain.resumed_by=<new
    id>`` and, if ``kill -9`` left it RUNNING, marked KILLED; its points stay as they were. The new
    run holds every step once. Without a ``run.json`` (or with a run the store does not know), the
    resumed run starts a run of its own.

    Args:
        save_dir: the logger's folder (None: the run folder's ``mlflow/``).
        tracking_uri: another store or a tracking server (None: ``MLFLOW_TRACKING_URI``, else the folder's
            SQLite store).
        experiment: the experiment's name, made if missing.
        run_name: the run's name (None: MLflow picks one).
        tags: extra run tags.

    Raises:
        ConfigurationError: mlflow is not installed, or an argument has the wrong type.
    """

    name = "mlflow"

    def __init__(self, save_dir: str | os.PathLike | None = None, tracking_uri: str | None = None,
                 experiment: str = "drivetrain", run_name: str | None = None,
                 tags: Mapping[str, Any] | None = None) -> None:
        super().__init__(save_dir)
        cls = type(self).__name__
        if tracking_uri is not None and not (isinstance(tracking_uri, str) and tracking_uri):
            raise ConfigurationError(f"{cls}(tracking_uri={tracking_uri!r}): pass a tracking URI such as "
                                     "'http://localhost:5000' or 'sqlite:///mlflow.db', or None for a store in the "
                                     "logger's folder.")
        if not (isinstance(experiment, str) and experiment.strip()):
            raise ConfigurationError(f"{cls}(experiment={experiment!r}): pass the experiment's name, a non-empty "
                                     "string such as 'drivetrain'.")
        if run_name is not None and not isinstance(run_name, str):
            raise ConfigurationError(f"{cls}(run_name={run_name!r}): pass a string, or None to let MLflow name "
                                     "the run.")
        if tags is not None and not isinstance(tags, Mapping):
            raise ConfigurationError(f"{cls}(tags={tags!r}): pass a dict of tag names to values, e.g. "
                                     "{'team': 'vision'}.")
        self.tracking_uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or None
        self.experiment = experiment
        self.run_name = run_name
        self.tags = {_key(str(k)): _cut(str(v), _MAX_TAG_VALUE) for k, v in (tags or {}).items()}
        database = self.tracking_uri is None or self.tracking_uri.partition(":")[0].split("+")[0] in _DATABASE_SCHEMES
        require_modules(self.name, ("mlflow", "sqlalchemy", "alembic") if database else ("mlflow",), INSTALL)
        self.client: Any = None
        self.run_id: str | None = None
        self.log_dir: str | None = None
        self.uri: str | None = None
        self._keys: dict[str, str] = {}
        self._pending: list[Any] = []  # RunOperations of asynchronous writes, waited for in flush()
        self._entities: Any = None  # (Metric, Param, RunTag), looked up once in open()

    # ------------------------------------------------------------------ lifecycle
    def open(self, run_dir: str, resume_step: int | None) -> None:
        try:
            from mlflow.entities import Metric, Param, RunTag
            from mlflow.tracking import MlflowClient
        except ImportError as exc:
            raise ConfigurationError(f"the 'mlflow' logger cannot import mlflow ({exc}): {INSTALL}.") from None

        folder = self.save_dir if self.save_dir is not None else os.path.join(run_dir, "mlflow")
        os.makedirs(folder, exist_ok=True)
        self.log_dir = folder
        self._entities = (Metric, Param, RunTag)
        self._keys = {}
        local = self.tracking_uri is None
        self.uri = f"sqlite:///{pathlib.Path(folder, DB_FILE).resolve().as_posix()}" if local else self.tracking_uri
        self.client = client = MlflowClient(tracking_uri=self.uri)
        experiment_id = self._experiment_id(pathlib.Path(folder, "artifacts").resolve().as_uri() if local else None)

        crashed = self._crashed_run(folder) if resume_step is not None else None
        tags = dict(self.tags)
        if resume_step is not None:
            tags["drivetrain.resume_step"] = str(resume_step)
        if crashed is not None:
            tags["drivetrain.resumed_from"] = crashed.info.run_id
        run_name = self.run_name or (crashed.info.run_name if crashed is not None else None)
        run = client.create_run(experiment_id, run_name=run_name, tags=tags)
        self.run_id = run.info.run_id
        write_json(os.path.join(folder, RUN_FILE), {"run_id": self.run_id, "experiment_id": experiment_id,
                                                    "tracking_uri": self.uri})
        if crashed is not None:
            assert resume_step is not None
            self._continue(crashed, resume_step)

    def log_hyperparams(self, params: Mapping[str, Any]) -> None:
        Param = self._entities[1]  # noqa: N806 - an MLflow entity class
        flat: dict[str, str] = {}
        for name, value in _flatten(params):
            flat[_key(name)] = _cut(value if isinstance(value, str) else str(value), _MAX_PARAM_VALUE)
        for chunk in _chunks([Param(k, v) for k, v in flat.items()], _MAX_PARAMS_PER_CALL):
            self._log(params=chunk)

    def log_scalars(self, scalars: Mapping[str, float], step: int) -> None:
        Metric = self._entities[0]  # noqa: N806 - an MLflow entity class
        now = int(time.time() * 1000)
        values = {self._metric_key(name): float(value) for name, value in scalars.items()}  # one per key
        metrics = [Metric(key, value, now, step) for key, value in values.items()]
        for chunk in _chunks(metrics, _MAX_METRICS_PER_CALL):
            self._log(metrics=chunk)

    def flush(self) -> None:
        pending, self._pending = self._pending, []
        for operations in pending:
            operations.wait()

    def close(self, status: str, summary: Mapping[str, Any]) -> None:
        if self.client is None or self.run_id is None:
            return
        RunTag = self._entities[2]  # noqa: N806 - an MLflow entity class
        try:
            self.flush()
            tags = {"drivetrain.status": status}
            tags.update({_key(f"drivetrain.summary.{name}"): str(value) for name, value in summary.items()})
            for chunk in _chunks([RunTag(k, _cut(v, _MAX_TAG_VALUE)) for k, v in tags.items()], _MAX_PARAMS_PER_CALL):
                self._log(tags=chunk)
            self.flush()
            self.client.set_terminated(self.run_id, _STATUS.get(status, "FAILED"))
        finally:
            self._release()

    def describe(self) -> str:
        where = self.uri or self.tracking_uri or os.path.abspath(self.save_dir or ".")
        run = f", run {self.run_id}" if self.run_id else ""
        return f"{self.name} in {where} (experiment {self.experiment!r}{run})"

    # -------------------------------------------------------------------- helpers
    def _log(self, **entities: Sequence[Any]) -> None:
        """One ``log_batch`` call; MLflow's asynchronous mode (if switched on) is waited for in flush()."""
        assert self.run_id is not None
        operations = self.client.log_batch(self.run_id, **entities)
        if operations is not None:
            self._pending.append(operations)

    def _metric_key(self, name: str) -> str:
        key = self._keys.get(name)
        if key is None:
            key = self._keys[name] = _key(name)
        return key

    def _experiment_id(self, artifact_location: str | None) -> str:
        experiment = self.client.get_experiment_by_name(self.experiment)
        if experiment is None:
            return str(self.client.create_experiment(self.experiment, artifact_location=artifact_location))
        if experiment.lifecycle_stage == "deleted":
            raise ConfigurationError(
                f"MLflowLogger(experiment={self.experiment!r}): that experiment is deleted in {self.uri}; restore it "
                f"(mlflow experiments restore --experiment-id {experiment.experiment_id}) or pick another name."
            )
        return str(experiment.experiment_id)

    def _crashed_run(self, folder: str) -> Any:
        """The MLflow run named by ``run.json`` (the run a resume continues), or None if there is none to find."""
        from mlflow.exceptions import MlflowException

        try:
            with open(os.path.join(folder, RUN_FILE), encoding="utf-8") as f:
                run_id = json.load(f)["run_id"]
            return self.client.get_run(str(run_id))
        except (OSError, ValueError, KeyError, TypeError, MlflowException):
            return None  # no record of it, or not in this store: the resumed run starts a fresh MLflow run

    def _continue(self, crashed: Any, resume_step: int) -> None:
        """Copy the crashed run's points up to ``resume_step`` into the new run; point the crashed run to it."""
        points = [point for key in sorted(crashed.data.metrics)
                  for point in self.client.get_metric_history(crashed.info.run_id, key) if point.step <= resume_step]
        for chunk in _chunks(points, _MAX_METRICS_PER_CALL):
            self._log(metrics=chunk)
        self.client.set_tag(crashed.info.run_id, "drivetrain.resumed_by", self.run_id)
        if crashed.info.status == "RUNNING":  # killed without a close(): not running any more
            self.client.set_terminated(crashed.info.run_id, "KILLED")

    def _release(self) -> None:
        """Forget the client; close a local store's database connections so the file is not held open."""
        client, self.client = self.client, None
        if self.tracking_uri is None:
            try:
                client._tracking_client.store.engine.dispose()  # MLflow has no public close; best effort
            except Exception:  # noqa: S110 - an MLflow without these internals keeps its pooled connection
                pass


def _key(name: str) -> str:
    """``name`` as an MLflow key: allowed characters only, no empty, ``.`` or ``..`` path parts, at most 250 long."""
    parts = [part for part in _NOT_IN_KEYS.sub("_", name).split("/") if part]
    key = "/".join("_" if part in (".", "..") else part for part in parts)[:_MAX_KEY].rstrip("/")
    return key or "_"


def _cut(value: str, limit: int) -> str:
    return value if len(value) <= limit else value[:limit - 3] + "..."


def _flatten(params: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for name, value in params.items():
        if isinstance(value, Mapping) and value:
            yield from _flatten(value, f"{prefix}{name}/")
        else:
            yield f"{prefix}{name}", value


def _chunks(items: list[Any], size: int) -> Iterator[list[Any]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]
