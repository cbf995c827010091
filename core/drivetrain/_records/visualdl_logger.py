"""VisualDL records (PaddlePaddle's dashboard), written with ``visualdl.LogWriter``.

VisualDL reads one record file per folder: of the ``vdlrecords*`` files directly in a folder,
its ``LogReader`` (and so ``visualdl --logdir``) takes the one whose name sorts last and
ignores the others; it never merges files nor drops a repeated step, and ``LogWriter`` cannot
append to an existing file. So each session of a run writes a new file, named by the
nanosecond it opened (later sessions sort later), and a resumed session first copies the
scalars of the file it continues (the newest one) up to its checkpoint's step, then renames
that file ``superseded.<time>.log``: VisualDL no longer reads it, it stays on disk for
inspection. A reader started after the resume sees every step once: the steps up to the
checkpoint as the first session logged them, the later ones from the resumed session.

Limits: a VisualDL server that had already read the crashed session keeps those points in
memory and adds the new file's on top, so restart it after a resume. The copy goes through
``LogWriter.add_scalar`` (about 2 seconds per 50,000 earlier points, once per resume). Text
entries (configuration, status) are not copied: each session writes its own. A process
killed during that copy leaves the old file in place beside a partial new one, which the
next resume would continue: delete the newest file by hand in that case. A fresh run into a
folder that already holds records hides them (VisualDL shows the newest file), so give each
run its own folder. Importing ``visualdl`` creates ``~/.visualdl/conf/config.json``
(VisualDL's own start-up).
"""

from __future__ import annotations

import json
import os
import struct
import time
from collections.abc import Iterator, Mapping
from typing import Any

from .logger import Logger, dashboard_tag, require_modules

INSTALL = 'pip install visualdl (or, from a drivetrain checkout, pip install -e ".[visualdl]")'
RECORD_MARK = "vdlrecords"  # VisualDL reads only files whose name holds this
SUPERSEDED = "superseded"  # what a resumed run renames the file it continued to (VisualDL skips it)
_LENGTH = struct.Struct("<Q")  # a VisualDL record: its length (8 bytes, little-endian), then the protobuf


class VisualDLLogger(Logger):
    """Scalars as VisualDL records under ``save_dir`` (default: the run folder's ``visualdl/``).

    View them with ``visualdl --logdir RUN_DIR/visualdl``. Training scalars and evaluations
    (``eval/<name>``) go to the Scalar tab. The configuration goes to the HyperParameters tab
    (nested keys joined with ``.``, lists and other values as JSON text, with ``train/loss``
    as the compared metric) and, in full as JSON, to the Text tab (``hparams``); the end
    status is the text ``status``. Tag names keep letters, digits and ``-/_.``; other
    characters become ``_``. See the module docstring for what a resumed run does to the files.

    Args:
        save_dir: the folder of the records (None: the run folder's ``visualdl/``).

    Raises:
        ConfigurationError: visualdl is not installed (the message gives the install command).
    """

    name = "visualdl"

    def __init__(self, save_dir: str | os.PathLike | None = None) -> None:
        super().__init__(save_dir)
        require_modules(self.name, ("visualdl",), INSTALL)
        self.writer: Any = None
        self.log_dir: str | None = None

    def open(self, run_dir: str, resume_step: int | None) -> None:
        from visualdl import LogWriter

        self.close_writer()
        folder = self.save_dir if self.save_dir is not None else os.path.join(run_dir, "visualdl")
        os.makedirs(folder, exist_ok=True)
        self.log_dir = folder
        newest = newest_record_file(folder)
        continued = newest if resume_step is not None else None
        file_name = f"{RECORD_MARK}.{time.time_ns()}.log"
        if newest is not None and os.path.basename(newest) >= file_name:  # a clock set back: still sort last
            file_name = f"{os.path.basename(newest).removesuffix('.log')}1.log"
        self.writer = LogWriter(logdir=folder, file_name=file_name)
        if continued is not None and resume_step is not None:
            for tag, value, step, walltime in read_scalars(continued):
                if step <= resume_step:
                    self.writer.add_scalar(tag, value, step, walltime=walltime)
            self.writer.flush()  # the kept points are on disk before the file they came from is set aside
            aside = os.path.join(folder, os.path.basename(continued).replace(RECORD_MARK, SUPERSEDED, 1))
            os.replace(continued, aside)

    def log_hyperparams(self, params: Mapping[str, Any]) -> None:
        self.writer.add_hparams(_flat(params), [dashboard_tag("train/loss")])
        self.writer.add_text("hparams", json.dumps(dict(params), indent=2, default=str), 0)

    def log_scalars(self, scalars: Mapping[str, float], step: int) -> None:
        for name, value in scalars.items():
            self.writer.add_scalar(dashboard_tag(name), float(value), step)

    def flush(self) -> None:
        if self.writer is not None:
            self.writer.flush()

    def close(self, status: str, summary: Mapping[str, Any]) -> None:
        if self.writer is not None:
            self.writer.add_text("status", status, int(summary.get("step", 0)))
            self.close_writer()

    def close_writer(self) -> None:
        """Flush and close the record file (and VisualDL's writer thread), if one is open."""
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    def describe(self) -> str:
        return f"{self.name} in {os.path.abspath(self.log_dir or self.save_dir or '.')}"


def newest_record_file(folder: str) -> str | None:
    """The record file VisualDL reads in ``folder``: the ``vdlrecords`` file whose name sorts last."""
    names = sorted(name for name in os.listdir(folder)
                   if RECORD_MARK in name and os.path.isfile(os.path.join(folder, name)))
    return os.path.join(folder, names[-1]) if names else None


def read_scalars(path: str) -> Iterator[tuple[str, float, int, int]]:
    """``(tag, value, step, walltime)`` of the scalar records in a VisualDL file, in order.

    A record cut short by a crash (the file ends inside it) ends the reading: VisualDL's own
    reader would fail on it.
    """
    from visualdl.proto import record_pb2

    with open(path, "rb") as f:
        data = f.read()
    at = 0
    while at + _LENGTH.size <= len(data):
        (length,) = _LENGTH.unpack_from(data, at)
        start, at = at + _LENGTH.size, at + _LENGTH.size + length
        if at > len(data):
            return
        record = record_pb2.Record()
        try:
            record.ParseFromString(data[start:at])
        except Exception:  # protobuf's DecodeError: bytes that are no record end the reading too
            return
        for value in record.values:
            if value.WhichOneof("one_value") == "value":
                yield value.tag, value.value, value.id, value.timestamp


def _flat(params: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """The configuration as VisualDL's hyperparameters hold it: one level, int, float or str values."""
    out: dict[str, Any] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(_flat(value, f"{name}."))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[name] = value
        elif isinstance(value, str):
            out[name] = value
        else:  # bool, None, lists, objects: as JSON text (VisualDL would drop None and print about the rest)
            out[name] = json.dumps(value, default=str)
    return out
