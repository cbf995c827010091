"""Weights & Biases runs, written through the ``wandb`` package (imported only when the logger is made).

wandb hands every call to its own service process (``wandb-core``), which sends the data to
the server (online) or appends it to the run's ``.wandb`` file (offline: ``wandb sync`` uploads
it later). Each logged step becomes one history row at ``_step`` = the global batch count; an
evaluation at the same step joins that row. The run id is kept in ``wandb_run.json`` beside
wandb's own ``wandb/`` folder, so a resumed Trainer run continues the same W&B run.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from typing import Any

from .._common import ConfigurationError
from .files import write_json
from .logger import Logger, require_modules

INSTALL = 'pip install wandb (or, from a drivetrain checkout, pip install -e ".[wandb]")'
RUN_FILE = "wandb_run.json"
MODES = ("online", "offline", "disabled", "shared")
RESUMES = ("rewind", "fork", "new")

# quiet defaults, each used only where the environment does not choose (WANDB_SILENT=false brings wandb's
# messages back): no banner or sync hints in the training console, no capture of stdout/stderr (the progress
# bar redraws there), and the .wandb file written every second like the other records (wandb-core's default
# is every 15 s; the setting is private, so it is set only where the installed wandb has it)
_QUIET = {"silent": ("WANDB_SILENT", True), "console": ("WANDB_CONSOLE", "off"),
          "x_transaction_log_flush_interval": ("WANDB__TRANSACTION_LOG_FLUSH_INTERVAL", 1.0)}


class WandbLogger(Logger):
    """A W&B run: configuration, training scalars and evaluations as history, the end as summary.

    ``mode`` is wandb's (``"online"``, ``"offline"``, ``"disabled"``); None leaves it to the
    environment (``WANDB_MODE``, ``wandb offline``), online by default. ``project``, ``name``,
    ``tags`` and any other ``wandb.init`` argument (``entity=``, ``group=``, ``settings=``...)
    are passed on; a ``settings=`` of your own replaces the quiet defaults (no wandb messages,
    no console capture). wandb's files go under ``save_dir`` (default: the run folder), in
    ``wandb/``. Evaluations are logged as ``eval/<name>`` at the step they ran.
    If a W&B run is already active when training starts (``wandb.init`` in your script, a sweep
    agent), the record goes into that run and it is left open at the end.

    A resumed Trainer run (``resume_from=``) continues the W&B run that crashed, so that each
    step is recorded once; ``resume`` picks how:

    * ``"rewind"`` (default): the same run id, with wandb's ``resume_from="<id>?_step=<n>"``:
      the server truncates the history after the checkpoint's step ``n`` and the run goes on
      from there. Offline, the rewind is stored in the new ``.wandb`` file (a new
      ``offline-run-*`` folder with the same id) and applied when ``wandb sync`` uploads the
      folders in order; the server must support rewinding (W&B's cloud does, as a preview).
    * ``"fork"``: a new run, ``fork_from="<id>?_step=<n>"``: the server copies the crashed run's
      history up to ``n`` into it (a server feature too).
    * ``"new"``: a new run whose first row is after ``n``, with ``resumed_from`` (the crashed
      run's id and ``n``) in its config; no server feature needed, but the history before the
      checkpoint stays in the crashed run, which also keeps the steps it logged after ``n``.

    Flushing: :meth:`flush` does nothing, because wandb has no call for it: every ``log`` is
    already handed to wandb-core, which writes the ``.wandb`` file on its own schedule (here each
    second) and keeps the latest step's row open until a later step or the end of the run, so
    a ``kill -9`` loses that row and at most the last second. :meth:`close` finishes the run
    and, when no other W&B run is active, stops wandb's service process, so the files are
    complete and no process is left behind when the Trainer returns.

    Args:
        save_dir: the folder wandb's files go under, in ``wandb/`` (None: the run folder).
        project: the W&B project.
        name: the run's name (None: W&B picks one).
        mode: ``"online"``, ``"offline"``, ``"disabled"``, or None for the environment's choice.
        tags: the run's tags.
        resume: ``"rewind"``, ``"fork"`` or ``"new"``: how a resumed Trainer run continues (see above).
        **init_kwargs: any other ``wandb.init`` argument (``entity=``, ``group=``, ``settings=``...).

    Raises:
        ConfigurationError: wandb is not installed, or ``mode``/``resume`` is not one of the values above.
    """

    name = "wandb"

    def __init__(self, save_dir: str | os.PathLike | None = None, project: str = "drivetrain",
                 name: str | None = None, mode: str | None = None, tags: list[str] | tuple[str, ...] | None = None,
                 resume: str = "rewind", **init_kwargs: Any) -> None:
        super().__init__(save_dir)
        require_modules(self.name, ("wandb",), INSTALL)
        if mode is not None and mode not in MODES:
            raise ConfigurationError(
                f"WandbLogger(mode={mode!r}): pass one of {list(MODES)}, or None to follow WANDB_MODE."
            )
        if resume not in RESUMES:
            raise ConfigurationError(f"WandbLogger(resume={resume!r}): pass one of {list(RESUMES)}.")
        if not isinstance(project, str) or not project:
            raise ConfigurationError(f"WandbLogger(project={project!r}): project must be a non-empty string.")
        for taken in ("dir", "id", "resume_from", "fork_from", "config", "reinit"):
            if taken in init_kwargs:
                raise ConfigurationError(
                    f"WandbLogger({taken}=...): the logger sets wandb.init's {taken!r} itself; pass save_dir= for "
                    "the folder, and let a resumed Trainer run choose the run id."
                )
        self.project = project
        self.run_name = name
        self.mode = mode
        self.tags = list(tags) if tags is not None else None
        self.resume = resume
        self.init_kwargs = init_kwargs
        self.run: Any = None
        self.folder_path: str | None = None
        self._owned = False  # False: the run was started by someone else, who finishes it
        self._hooks: tuple[Any, Any] | None = None  # sys.exit and sys.excepthook before wandb wrapped them

    def open(self, run_dir: str, resume_step: int | None) -> None:
        import wandb

        folder = self.folder(run_dir)
        self.folder_path = folder
        if wandb.run is not None:  # a run of the user's (or a sweep agent's): log into it, leave it open
            self.run, self._owned = wandb.run, False
            return
        kwargs: dict[str, Any] = {"project": self.project, "name": self.run_name, "mode": self.mode,
                                  "tags": self.tags, "dir": folder, "settings": _settings(wandb),
                                  **self.init_kwargs}
        previous = _read_run_file(os.path.join(folder, RUN_FILE)) if resume_step is not None else None
        if previous is not None:
            moment = f"{previous}?_step={resume_step}"
            if self.resume == "rewind":
                kwargs["resume_from"] = moment
            elif self.resume == "fork":
                kwargs["fork_from"] = moment
            else:
                kwargs["config"] = {"resumed_from": {"run_id": previous, "step": resume_step}}
        if hasattr(kwargs["settings"], "model_copy"):  # wandb.init writes into it: a user's object stays reusable
            kwargs["settings"] = kwargs["settings"].model_copy()
        self._hooks = (sys.exit, sys.excepthook)
        self.run = wandb.init(**{k: v for k, v in kwargs.items() if v is not None})
        self._owned = True
        write_json(os.path.join(folder, RUN_FILE), {"id": self.run.id, "project": self.run.project,
                                                     "resumed_from": previous, "resume_step": resume_step})

    def log_hyperparams(self, params: Mapping[str, Any]) -> None:
        if self.run is not None:
            self.run.config.update(dict(params), allow_val_change=True)

    def log_scalars(self, scalars: Mapping[str, float], step: int) -> None:
        if self.run is not None:
            self.run.log(dict(scalars), step=step)

    def flush(self) -> None:
        """Nothing to do: wandb-core already has every row and writes on its own (see the class docstring)."""

    def close(self, status: str, summary: Mapping[str, Any]) -> None:
        run, self.run = self.run, None
        if run is None:
            return
        run.summary.update({"status": status, **summary})
        if not self._owned:
            return
        run.finish(exit_code=1 if status == "failed" else 0)
        import wandb

        if wandb.run is None:  # nothing else uses wandb's service: stop it, which waits for the files
            wandb.teardown()
            _unwrap(self._hooks)

    def describe(self) -> str:
        if self.run is None:
            return super().describe()
        mode = "offline" if self.run.offline else "disabled" if self.run.disabled else "online"
        where = getattr(self.run.settings, "sync_dir", None) or self.folder_path or ""
        url = f", {self.run.url}" if mode == "online" and self.run.url else ""
        return f"{self.name} ({mode}, run {self.run.id}{url}) in {os.path.abspath(where)}"


def _settings(wandb: Any) -> Any:
    """wandb's settings with the logger's quiet defaults, except those the environment already sets."""
    fields = getattr(wandb.Settings, "model_fields", {})
    chosen = {key: value for key, (env, value) in _QUIET.items() if env not in os.environ and key in fields}
    return wandb.Settings(**chosen)


def _unwrap(hooks: tuple[Any, Any] | None) -> None:
    """Put back the ``sys.exit`` and ``sys.excepthook`` that wandb wraps at each start (to learn the exit code)
    and leaves wrapped after it stopped; a hook someone else set in between is kept."""
    if hooks is None:
        return
    for name, original in zip(("exit", "excepthook"), hooks, strict=True):
        current = getattr(sys, name)
        owner = getattr(current, "__self__", None)
        if current is not original and type(owner).__module__.startswith("wandb."):
            setattr(sys, name, original)


def _read_run_file(path: str) -> str | None:
    """The W&B run id a previous Trainer run stored in ``path``; None where there is none (or it is unreadable)."""
    try:
        with open(path, encoding="utf-8") as f:
            run_id = json.load(f).get("id")
    except (OSError, ValueError, AttributeError):
        return None
    return run_id if isinstance(run_id, str) and run_id else None
