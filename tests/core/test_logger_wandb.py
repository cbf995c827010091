"""The W&B logger, offline (no network, no account): its .wandb files read back next to the CSV logger's rows."""

from __future__ import annotations

import glob
import json
import logging
import os
import struct
import subprocess
import sys
import time
import zlib
from typing import Any

import pytest

from drivetrain import CallbackError, CheckpointCallback, ConfigurationError
from drivetrain._records.files import read_csv_rows

from ._callback_helpers import make_trainer, stop_after

EVERY = 5
pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def offline(tmp_path, monkeypatch):
    """wandb offline, quiet, and writing only under tmp_path (nothing in $HOME); the module, imported."""
    wandb = pytest.importorskip("wandb")
    home = tmp_path / "wandb-home"
    for var, sub in (("WANDB_DIR", "dir"), ("WANDB_CACHE_DIR", "cache"), ("WANDB_CONFIG_DIR", "config"),
                     ("WANDB_DATA_DIR", "data"), ("WANDB_ARTIFACT_DIR", "artifacts")):
        monkeypatch.setenv(var, str(home / sub))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB__DISABLE_STATS", "true")  # no system-metrics sampler process
    for var in ("WANDB_SILENT", "WANDB_CONSOLE", "WANDB_API_KEY", "WANDB_RUN_ID", "WANDB_RESUME"):
        monkeypatch.delenv(var, raising=False)
    yield wandb
    assert wandb.run is None
    assert _children_named("wandb-core") == []  # the service process ended with the run


# ---------------------------------------------------------------- reading .wandb files
# wandb 0.31 has no Python reader for its .wandb files (wandb-core, in Go, reads them); this one follows the
# format: a 7-byte file header (":W&B", a 2-byte magic, a version byte), then 32 KiB blocks of chunks, each
# with a 7-byte header (CRC-32 of type byte + data, little-endian length, type: full/first/middle/last), whose
# data are serialized wandb_internal.Record protocol buffers.
BLOCK = 32768


def wandb_records(path: str) -> list[Any]:
    from wandb.proto.wandb_internal_pb2 import Record

    with open(path, "rb") as f:
        data = f.read()
    assert data[:4] == b":W&B", data[:7]
    records, pending, pos = [], b"", 7
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:
            pos += left
            continue
        crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0:  # block padding
            pos += left
            continue
        body = data[pos + 7:pos + 7 + length]
        assert zlib.crc32(bytes([kind]) + body) == crc, f"bad chunk at byte {pos} of {path}"
        pos += 7 + length
        pending = body if kind in (1, 2) else pending + body
        if kind in (1, 4):
            record = Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


def _key(item: Any) -> str:
    return item.key or "/".join(item.nested_key)


def read_run(path: str) -> dict[str, Any]:
    """One offline run file as {"run": RunRecord, "rows": [...], "config": {...}, "summary": {...}, "exit": code}."""
    out: dict[str, Any] = {"rows": [], "config": {}, "summary": {}, "exit": None, "run": None}
    for record in wandb_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            out["run"] = record.run
            out["config"].update({_key(i): json.loads(i.value_json) for i in record.run.config.update})
        elif kind == "config":
            out["config"].update({_key(i): json.loads(i.value_json) for i in record.config.update})
        elif kind == "history":
            row = {_key(i): json.loads(i.value_json) for i in record.history.item}
            out["rows"].append({"step": record.history.step.num,
                                **{k: v for k, v in row.items() if not k.startswith("_")}})
        elif kind == "summary":
            out["summary"].update({_key(i): json.loads(i.value_json) for i in record.summary.update})
        elif kind == "exit":
            out["exit"] = record.exit.exit_code
    return out


def run_files(folder) -> list[str]:
    """The .wandb files under ``folder``'s wandb/ folder, oldest first.

    wandb names a run's folder ``offline-run-<start time>-<id>``, with ``-1``, ``-2``... added when a
    run of the same id started in the same second.
    """
    def start(path: str) -> tuple[str, int]:
        parts = os.path.basename(os.path.dirname(path)).split("-")
        return parts[2], int(parts[4]) if len(parts) > 4 else 0

    paths = sorted(glob.glob(os.path.join(folder, "wandb", "offline-run-*", "run-*.wandb")), key=start)
    assert paths, f"no offline run under {folder}"
    return paths


def by_step(rows: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """CSV rows merged per step: wandb keeps an evaluation in the row of the training step it follows."""
    merged: dict[int, dict[str, Any]] = {}
    for row in rows:
        merged.setdefault(int(row["step"]), {}).update(row)
    return merged


def _children_named(name: str) -> list[int]:
    if not os.path.isdir("/proc"):
        return []
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        command, _, rest = stat.partition("(")[2].rpartition(")")
        fields = rest.split()
        if command == name and int(fields[1]) == os.getpid() and fields[0] != "Z":
            found.append(int(pid))
    return found


# -------------------------------------------------------------------------- tests
def test_rows_config_and_summary_match_the_csv_record_and_a_resume_rewinds_the_same_run(offline, tmp_path,
                                                                                          caplog) -> None:
    from drivetrain._records.wandb_logger import RUN_FILE, WandbLogger

    run_dir = tmp_path / "run"
    hooks = (sys.exit, sys.excepthook)
    caplog.set_level(logging.INFO, logger="drivetrain")
    first = make_trainer([CheckpointCallback(tmp_path / "ckpt", every_n_batches=12)],
                         loggers=[WandbLogger(project="tests"), "csv"], log_every_n_steps=EVERY, run_dir=run_dir,
                         script=lambda step: step / 100, evaluate_every=-1)
    stop_after(first, 23)  # the checkpoint is at step 12; the failed run logs up to 23
    with pytest.raises(CallbackError):
        first.run()
    said = [r.getMessage() for r in caplog.records if r.name == "drivetrain"]
    assert any("wandb (offline, run " in line and str(run_dir / "wandb" / "offline-run-") in line for line in said)
    [crashed_file] = run_files(run_dir)
    crashed = read_run(crashed_file)
    run_id = crashed["run"].run_id
    assert json.loads((run_dir / RUN_FILE).read_text())["id"] == run_id
    csv_rows = by_step(read_csv_rows(str(run_dir / "metrics.csv")))
    assert list(csv_rows) == [5, 10, 13, 15, 20, 23]
    assert {row["step"]: row for row in crashed["rows"]} == csv_rows  # side by side, value for value
    assert crashed["exit"] == 1 and crashed["summary"]["status"] == "failed" and crashed["summary"]["step"] == 23
    assert crashed["config"]["n_epochs"] == 3 and "numpy" in crashed["config"]["driver"]

    resumed = make_trainer([CheckpointCallback(tmp_path / "ckpt", every_n_batches=12)],
                           loggers=[WandbLogger(project="tests"), "csv"], log_every_n_steps=EVERY,
                           script=lambda step: step / 100, evaluate_every=-1)
    resumed.run(resume_from=tmp_path / "ckpt")
    crashed_again, resumed_file = run_files(run_dir)
    assert crashed_again == crashed_file
    cont = read_run(resumed_file)
    # the same W&B run, rewound to the checkpoint: the server keeps the crashed run's rows up to step 12
    # (wandb sync uploads the rewind with the rows); the resumed file holds every row after it
    assert cont["run"].run_id == run_id
    assert (cont["run"].branch_point.run, cont["run"].branch_point.value, cont["run"].branch_point.metric) == \
        (run_id, 12, "_step")
    rewound = [row for row in crashed["rows"] if row["step"] <= 12] + cont["rows"]
    csv_rows = by_step(read_csv_rows(str(run_dir / "metrics.csv")))
    assert [row["step"] for row in rewound] == list(csv_rows) == [5, 10, 13, 15, 20, 25, 26, 30, 35, 39]
    assert {row["step"]: row for row in rewound} == csv_rows
    assert cont["exit"] == 0
    assert cont["summary"]["status"] == "finished" and cont["summary"]["step"] == 39
    assert cont["summary"]["train/loss"] == csv_rows[39]["train/loss"]
    assert cont["summary"]["score#score"] == pytest.approx(0.39)
    assert cont["config"]["n_epochs"] == 3
    assert (sys.exit, sys.excepthook) == hooks  # wandb wraps both at each start; the logger puts them back


@pytest.mark.parametrize("resume", ["fork", "new"])
def test_the_other_resume_modes_start_a_new_run_that_names_the_crashed_one(offline, tmp_path, resume) -> None:
    from drivetrain._records.wandb_logger import RUN_FILE, WandbLogger

    (tmp_path / RUN_FILE).write_text(json.dumps({"id": "crashed1"}))
    logger = WandbLogger(tmp_path, project="tests", resume=resume)
    logger.open(str(tmp_path / "unused"), resume_step=12)
    logger.log_scalars({"train/loss": 0.5}, 15)
    logger.close("finished", {"step": 15})
    [path] = run_files(tmp_path)
    record = read_run(path)
    assert record["run"].run_id != "crashed1"
    assert json.loads((tmp_path / RUN_FILE).read_text())["id"] == record["run"].run_id
    assert record["rows"] == [{"step": 15, "train/loss": 0.5}]
    if resume == "fork":
        assert (record["run"].branch_point.run, record["run"].branch_point.value) == ("crashed1", 12)
    else:
        assert record["config"]["resumed_from"] == {"run_id": "crashed1", "step": 12}
    assert not (tmp_path / "unused").exists()  # save_dir was given


KILLED = """
import os, sys, time
from drivetrain._records.wandb_logger import WandbLogger
logger = WandbLogger(sys.argv[1], project="tests")
logger.open(sys.argv[1], None)
for step in (5, 10, 15, 20):
    logger.log_scalars({"train/loss": 1 / step}, step)
logger.flush()
print("logged", flush=True)
time.sleep(60)
"""


def test_after_kill_9_the_file_holds_every_row_but_the_still_open_last_step(offline, tmp_path) -> None:
    child = subprocess.Popen([sys.executable, "-c", KILLED, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "logged\n"
        deadline, rows = time.monotonic() + 30, []
        while time.monotonic() < deadline and len(rows) < 3:  # written within about a second, without finish()
            time.sleep(0.2)
            rows = read_run(run_files(tmp_path)[0])["rows"]
    finally:
        child.kill()
        child.communicate()
    # wandb-core holds the row of the latest step open (an evaluation may still join it): only it is lost
    assert read_run(run_files(tmp_path)[0])["rows"] == [{"step": step, "train/loss": 1 / step} for step in (5, 10, 15)]


def test_a_run_the_user_started_is_logged_into_and_left_open(offline, tmp_path) -> None:
    from drivetrain._records.wandb_logger import WandbLogger

    run = offline.init(project="mine", dir=str(tmp_path), settings=offline.Settings(silent=True, console="off"))
    try:
        trainer = make_trainer(loggers=[WandbLogger()], log_every_n_steps=13, run_dir=tmp_path, n_epochs=1)
        trainer.run()
        assert offline.run is run and not run._is_finished
        run.log({"mine": 1.0}, step=20)
    finally:
        run.finish()
        offline.teardown()
    [path] = run_files(tmp_path)
    record = read_run(path)
    assert record["rows"] == [{"step": 13, **{k: v for k, v in trainer.history["train"][0].items()
                                              if k not in ("step", "epoch")}}, {"step": 20, "mine": 1.0}]
    assert record["summary"]["status"] == "finished" and record["config"]["n_epochs"] == 1


def test_without_wandb_the_error_says_how_to_install_it(monkeypatch) -> None:
    from drivetrain._records.wandb_logger import WandbLogger

    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb now raises ImportError
    with pytest.raises(ConfigurationError, match=r"the 'wandb' logger needs wandb, which is not installed: "
                                                 r"pip install wandb \(or, from a drivetrain checkout, pip install -e \"\.\[wandb\]\"\)"):
        WandbLogger()


@pytest.mark.parametrize(("kwargs", "fragment"), [
    ({"mode": "cloud"}, r"WandbLogger\(mode='cloud'\): pass one of \['online', 'offline'"),
    ({"resume": "allow"}, r"WandbLogger\(resume='allow'\): pass one of \['rewind', 'fork', 'new'\]"),
    ({"dir": "x"}, r"WandbLogger\(dir=...\): the logger sets wandb.init's 'dir' itself; pass save_dir="),
    ({"project": ""}, r"WandbLogger\(project=''\)"),
])
def test_bad_arguments_name_the_argument(kwargs, fragment) -> None:
    pytest.importorskip("wandb")
    from drivetrain._records.wandb_logger import WandbLogger

    with pytest.raises(ConfigurationError, match=fragment):
        WandbLogger(**kwargs)


def test_importing_drivetrain_and_the_logger_module_does_not_import_wandb() -> None:
    code = ("import sys, drivetrain, drivetrain.loggers, drivetrain._records.wandb_logger; "
            "print('wandb' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "False"
