"""TensorBoard event files, written with ``tensorboardX``'s protocol buffers (no torch or tensorflow needed).

All the scalars of one logged step go into one event, written synchronously into a buffered
file (tensorboardX's ``SummaryWriter`` would build one event per scalar and hand each to a
multiprocessing queue, which costs more than a small training step); the file is flushed
when the run recorder flushes (see :meth:`drivetrain.loggers.Logger.flush`). A resumed run
starts its event file with a ``SessionLog.START`` at the step after its checkpoint, which
makes TensorBoard discard what the crashed run wrote from there: the curves continue
without a doubled stretch.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from typing import Any

from .logger import Logger, dashboard_tag, require_modules

INSTALL = 'pip install tensorboardX (or, from a drivetrain checkout, pip install -e ".[tensorboard]")'


class TensorBoardLogger(Logger):
    """Scalars as TensorBoard events under ``save_dir`` (default: the run folder's ``tensorboard/``).

    View them with ``tensorboard --logdir RUN_DIR``. Tag names keep letters, digits, ``-/_.``;
    other characters become ``_`` (``eval/acc#acc#dev`` shows as ``eval/acc_acc_dev``). The
    configuration is written as a text summary (``hparams``, TensorBoard's Text tab).

    Args:
        save_dir: the folder of the event files (None: the run folder's ``tensorboard/``).

    Raises:
        ConfigurationError: tensorboardX is not installed (the message gives the install command).
    """

    name = "tensorboard"

    def __init__(self, save_dir: str | os.PathLike | None = None) -> None:
        super().__init__(save_dir)
        require_modules(self.name, ("tensorboardX",), INSTALL)
        self.writer: Any = None
        self.log_dir: str | None = None
        self._proto: Any = None  # (Event, Summary): tensorboardX's protobuf classes, looked up once in open()
        self._last_names: tuple[str, ...] = ()
        self._last_event: Any = None

    def open(self, run_dir: str, resume_step: int | None) -> None:
        from tensorboardX.event_file_writer import EventsWriter
        from tensorboardX.proto.event_pb2 import Event, SessionLog
        from tensorboardX.proto.summary_pb2 import Summary

        folder = self.save_dir if self.save_dir is not None else os.path.join(run_dir, "tensorboard")
        os.makedirs(folder, exist_ok=True)
        self.log_dir = folder
        self._proto = (Event, Summary)
        # event files are named by the second they were opened in and read in name order: a nanosecond
        # suffix keeps a quick resume from overwriting the file of the run it continues, and sorts after it
        self.writer = EventsWriter(os.path.join(folder, "events"), f".{time.time_ns()}")
        if resume_step is not None:
            self.writer.write_event(Event(step=resume_step + 1, wall_time=time.time(),
                                          session_log=SessionLog(status=SessionLog.START)))
        self.writer.flush()

    def log_hyperparams(self, params: Mapping[str, Any]) -> None:
        from tensorboardX.summary import text

        body = "\n".join(f"    {line}" for line in json.dumps(dict(params), indent=2, default=str).splitlines())
        self._write(text("hparams", body), 0)

    def log_scalars(self, scalars: Mapping[str, float], step: int) -> None:
        # the scalars of consecutive steps usually have the same names: their event is built once and its
        # step, time and values are overwritten (building the protocol buffers costs more than writing them)
        names = tuple(scalars)
        if names != self._last_names:
            Summary = self._proto[1]  # noqa: N806 - a protobuf class
            self._last_event = self._proto[0](summary=Summary(
                value=[Summary.Value(tag=dashboard_tag(name)) for name in names]))
            self._last_names = names
        event = self._last_event
        event.step, event.wall_time = step, time.time()
        for slot, value in zip(event.summary.value, scalars.values(), strict=True):
            slot.simple_value = value
        self.writer.write_event(event)

    def flush(self) -> None:
        if self.writer is not None:
            self.writer.flush()

    def close(self, status: str, summary: Mapping[str, Any]) -> None:
        if self.writer is not None:
            from tensorboardX.summary import text

            self._write(text("status", status), int(summary.get("step", 0)))
            self.writer.close()
            self.writer = None

    def describe(self) -> str:
        return f"{self.name} in {os.path.abspath(self.log_dir or self.save_dir or '.')}"

    def _write(self, summary: Any, step: int) -> None:
        self.writer.write_event(self._proto[0](wall_time=time.time(), step=step, summary=summary))
