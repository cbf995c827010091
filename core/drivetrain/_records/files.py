"""The loggers that need no dependency: a CSV table and a JSON-lines record, one row per logged step.

Both keep the rows of the run in memory (one per ``log_every_n_steps`` batches, so few), append
each new row to the open file (flushed when the recorder says, see ``Logger.flush``), and rewrite
the file atomically (temporary file, then rename) only when a resumed run drops the rows after
its checkpoint or a CSV column appears. Beside the
table they write ``hparams.json`` (the configuration) and ``summary.json`` (the end of the run).
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Mapping
from typing import Any

from .._common import atomic_write
from .logger import Logger

HPARAMS_FILE = "hparams.json"
SUMMARY_FILE = "summary.json"


def write_json(path: str, data: Any) -> None:
    """Write ``data`` as indented JSON, atomically (a reader never sees half a file)."""
    _replace(path, json.dumps(data, indent=2, default=str, allow_nan=True) + "\n")


def _replace(path: str, text: str) -> None:
    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8", newline="") as f:
            f.write(text)

    atomic_write(path, write)


def read_csv_rows(path: str) -> list[dict[str, Any]]:
    """The rows of a ``metrics.csv`` with numbers as numbers; a last line cut short by a crash is left out."""
    with open(path, encoding="utf-8", newline="") as f:
        text = f.read()
    text = text[:text.rfind("\n") + 1]
    rows = [{k: _number(v) for k, v in row.items() if v != ""} for row in csv.DictReader(io.StringIO(text))]
    return [row for row in rows if "step" in row]


def read_jsonl_rows(path: str) -> list[dict[str, Any]]:
    """The rows of a ``metrics.jsonl``; reading stops at a line cut short by a crash."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                break
    return [row for row in rows if isinstance(row, dict) and "step" in row]


class _RowFile(Logger):
    """A table of rows keyed by ``step``, kept in memory and mirrored to one file."""

    filename = ""

    def __init__(self, save_dir: str | os.PathLike | None = None) -> None:
        super().__init__(save_dir)
        self.path: str | None = None
        self.rows: list[dict[str, Any]] = []
        self._file: Any = None

    def open(self, run_dir: str, resume_step: int | None) -> None:
        folder = self.folder(run_dir)
        self.path = os.path.join(folder, self.filename)
        self.rows = []
        if resume_step is not None and os.path.exists(self.path):
            self.rows = [row for row in self._read(self.path) if int(row["step"]) <= resume_step]
        self._rewrite()

    def log_hyperparams(self, params: Mapping[str, Any]) -> None:
        if self.path is not None:
            write_json(os.path.join(os.path.dirname(self.path), HPARAMS_FILE), dict(params))

    def log_scalars(self, scalars: Mapping[str, float], step: int) -> None:
        row = {"step": step, **scalars}
        self.rows.append(row)
        self._append(row)

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()

    def close(self, status: str, summary: Mapping[str, Any]) -> None:
        self._close_file()
        if self.path is not None:
            write_json(os.path.join(os.path.dirname(self.path), SUMMARY_FILE), {"status": status, **summary})

    def describe(self) -> str:
        return f"{self.name} in {os.path.abspath(self.path)}" if self.path else super().describe()

    def _appending(self) -> Any:
        """The record file, open for appending (opened once, after every rewrite)."""
        if self._file is None:
            assert self.path is not None
            self._file = open(self.path, "a", encoding="utf-8", newline="")  # noqa: SIM115 - kept open
        return self._file

    def _close_file(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def _replace_file(self, text: str) -> None:
        assert self.path is not None
        self._close_file()
        _replace(self.path, text)

    # what a format supplies
    def _read(self, path: str) -> list[dict[str, Any]]:
        raise NotImplementedError

    def _rewrite(self) -> None:
        raise NotImplementedError

    def _append(self, row: dict[str, Any]) -> None:
        raise NotImplementedError


class CSVLogger(_RowFile):
    """``metrics.csv``: one row per logged step, a column per scalar (empty where a row has none).

    Read it back with the ``csv`` module or ``pandas.read_csv``; ``step`` is the global batch count.

    Args:
        save_dir: the folder to write to (None: the Trainer's run folder).
    """

    name = "csv"
    filename = "metrics.csv"

    def __init__(self, save_dir: str | os.PathLike | None = None) -> None:
        super().__init__(save_dir)
        self.columns: list[str] = ["step"]
        self._known = {"step"}
        self._writer: Any = None  # a csv writer on the open file, made again after every rewrite

    def _read(self, path: str) -> list[dict[str, Any]]:
        return read_csv_rows(path)

    def _rewrite(self) -> None:
        assert self.path is not None
        for row in self.rows:
            self.columns.extend(key for key in row if key not in self.columns)
        self._known = set(self.columns)
        lines = [self.columns] + [[row.get(column) for column in self.columns] for row in self.rows]
        self._writer = None
        self._replace_file("".join(_csv_line(line) for line in lines))

    def _append(self, row: dict[str, Any]) -> None:
        assert self.path is not None
        if not row.keys() <= self._known:
            self._rewrite()  # a new column: the header changes, so the file is written anew
            return
        if self._writer is None:
            self._writer = csv.writer(self._appending(), lineterminator="\n")
        self._writer.writerow([row.get(column) for column in self.columns])  # csv writes None as '', floats by repr


class JSONLinesLogger(_RowFile):
    """``metrics.jsonl``: one JSON object per logged step (``{"step": 100, "train/loss": 0.41, ...}``).

    Args:
        save_dir: the folder to write to (None: the Trainer's run folder).
    """

    name = "jsonl"
    filename = "metrics.jsonl"

    def _read(self, path: str) -> list[dict[str, Any]]:
        return read_jsonl_rows(path)

    def _rewrite(self) -> None:
        assert self.path is not None
        self._replace_file("".join(json.dumps(row) + "\n" for row in self.rows))

    def _append(self, row: dict[str, Any]) -> None:
        assert self.path is not None
        self._appending().write(json.dumps(row) + "\n")


def _csv_line(cells: list[Any]) -> str:
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerow(cells)
    return buffer.getvalue()


def _number(text: str) -> Any:
    try:
        value = float(text)
    except ValueError:
        return text
    return int(value) if value.is_integer() and "." not in text and "e" not in text.lower() else value

