"""The logger interface: what a run record receives, and when.

A :class:`Logger` is fed by the Trainer's run recorder (:mod:`drivetrain._records.recorder`)
on the global-zero process only: the run's configuration once, training scalars every
``log_every_n_steps`` batches, every evaluation result, and a final summary. The recorder
asks it to flush when a window closes, at most once a second, so a crash or ``kill -9``
loses at most the last second of the record; :meth:`Logger.open` tells it where a resumed
run continues, so records written after the checkpoint by the run that crashed are dropped
(or superseded) instead of duplicated.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
from collections.abc import Mapping
from typing import Any

from .._common import ConfigurationError

_NOT_IN_TAGS = re.compile(r"[^-/\w\.]")  # what TensorBoard does not allow in a tag (VisualDL: '%'), written as '_'


class Logger:
    """Base class of the run-record writers; override the methods you need (each default does nothing).

    ``save_dir`` is the folder a file-based logger writes to; None means the run folder the
    Trainer chose (``Trainer(run_dir=...)``, printed at the start). ``name`` is how errors
    and the ``loggers=`` strings name it.

    Args:
        save_dir: the folder to write to (None: the Trainer's run folder).

    Raises:
        ConfigurationError: ``save_dir`` is not a path.
    """

    name = "logger"

    def __init__(self, save_dir: str | os.PathLike | None = None) -> None:
        if save_dir is not None and not isinstance(save_dir, (str, os.PathLike)):
            raise ConfigurationError(
                f"{type(self).__name__}(save_dir={save_dir!r}): save_dir must be a folder path (str or "
                "os.PathLike), or None for the Trainer's run folder."
            )
        self.save_dir: str | None = None if save_dir is None else os.fspath(save_dir)

    def folder(self, run_dir: str) -> str:
        """The folder this logger writes to: its ``save_dir``, else ``run_dir``; created if missing.

        Args:
            run_dir: the Trainer's run folder.

        Returns:
            The folder's path.
        """
        folder = self.save_dir if self.save_dir is not None else run_dir
        os.makedirs(folder, exist_ok=True)
        return folder

    def open(self, run_dir: str, resume_step: int | None) -> None:
        """Prepare to write under ``run_dir`` (unless ``save_dir`` was given).

        ``resume_step`` is the global batch count of the checkpoint a resumed run started
        from (None for a fresh run): records after it belong to the run that crashed and
        are dropped, so the resumed run appends without duplicating steps.

        Args:
            run_dir: the Trainer's run folder.
            resume_step: the resumed checkpoint's global batch count, or None for a fresh run.
        """

    def log_hyperparams(self, params: Mapping[str, Any]) -> None:
        """The run's configuration, once at the start (plain data: str, numbers, bools, None, lists, dicts).

        Args:
            params: the configuration, ``{name: plain value}``.
        """

    def log_scalars(self, scalars: Mapping[str, float], step: int) -> None:
        """Training scalars (``train/loss``, ``train/lr``, ``train/samples_per_s``, ...) at global batch ``step``.

        Args:
            scalars: ``{name: value}``.
            step: the global batch count they belong to.
        """

    def log_evaluation(self, results: Mapping[str, float], step: int) -> None:
        """One evaluation's results at global batch ``step``; by default logged as ``eval/<name>`` scalars.

        Args:
            results: ``{"acc#acc#dev": 0.93, ...}``.
            step: the global batch count of the evaluation.
        """
        self.log_scalars({f"eval/{name}": value for name, value in results.items()}, step)

    def flush(self) -> None:
        """Push what was logged so far to disk. The recorder calls it when a window closes (at most once a
        second), after every evaluation, and before :meth:`close`; buffer writes until then."""

    def close(self, status: str, summary: Mapping[str, Any]) -> None:
        """The end of the run: ``status`` is ``"finished"``, ``"stopped"`` (early stop, Ctrl-C) or
        ``"failed"``; ``summary`` holds the last scalars, the step count and the time taken.

        Args:
            status: ``"finished"``, ``"stopped"`` or ``"failed"``.
            summary: the last scalars, the step count and the time taken.
        """

    def describe(self) -> str:
        """A few words for the start-of-run message: the logger and where it writes.

        Returns:
            E.g. ``"csv in runs/2026-11-28-101500"``.
        """
        return self.name if self.save_dir is None else f"{self.name} in {self.save_dir}"


@functools.lru_cache(maxsize=4096)
def dashboard_tag(name: str) -> str:
    """A scalar's name as a TensorBoard or VisualDL tag: letters, digits and ``-/_.`` kept, other characters ``_``
    (``eval/acc#acc#dev`` shows as ``eval/acc_acc_dev``), the same on both dashboards; cached, as the names repeat
    every logged step."""
    return _NOT_IN_TAGS.sub("_", name).lstrip("/")


def require_modules(logger: str, modules: tuple[str, ...], install: str) -> None:
    """Refuse to build logger ``logger`` when one of ``modules`` is not installed, naming them and ``install``.

    The modules are found without being imported (importing mlflow or wandb takes a second); they are
    imported when the run opens the logger.
    """
    missing = [module for module in modules if not _installed(module)]
    if missing:
        verb = "is" if len(missing) == 1 else "are"
        raise ConfigurationError(f"the {logger!r} logger needs {', '.join(missing)}, which {verb} not installed: "
                                 f"{install}.")


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False
