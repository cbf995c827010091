"""drivetrain's own messages: the ``drivetrain`` logger, its level per rank, and a handler that
writes where a progress bar expects it.

Messages go through ``logging.getLogger("drivetrain")``, so an application that configures
logging routes them like its own. When it has not (no handler on the ``drivetrain`` logger
or the root logger), drivetrain adds one that writes ``drivetrain: <message>`` lines to the
*current* ``sys.stderr`` at each message: a live rich progress bar redirects that stream
above its bars, so messages never tear a redraw. A handler a framework put on the root logger
at its import (paddle does) is not the application's configuration: a backend names its
format (:func:`ignore_framework_log_format`), and drivetrain's lines keep their own format. ``Trainer(log_level=...)`` sets the level;
by default the global-zero process shows ``info`` and the other ranks only warnings.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from .errors import ConfigurationError

logger = logging.getLogger("drivetrain")

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR,
          "critical": logging.CRITICAL}


_FRAMEWORK_FORMATS: set[str] = set()
"""Formats of the handlers frameworks put on the root logger themselves (not the application's logging)."""


def ignore_framework_log_format(fmt: str) -> None:
    """Declare ``fmt`` the format of a handler a framework adds to the root logger on import (paddle's
    ``[%(asctime)-15s] [%(levelname)8s] ...``), so drivetrain does not take it for the application's logging
    configuration: its own lines then keep the ``drivetrain: <message>`` format."""
    _FRAMEWORK_FORMATS.add(fmt)


def _application_handlers() -> list[logging.Handler]:
    """The root logger's handlers, less those a framework added at its import."""
    return [h for h in logging.getLogger().handlers
            if getattr(h.formatter, "_fmt", None) not in _FRAMEWORK_FORMATS]


class _CurrentStderr(logging.StreamHandler):
    """A stream handler that looks ``sys.stderr`` up at every message (a progress bar may have replaced it)."""

    def emit(self, record: logging.LogRecord) -> None:
        self.setStream(sys.stderr)
        super().emit(record)


def check_log_level(level: Any) -> int | None:
    """``log_level``: None (the default per rank), a name such as ``"info"``, or a ``logging`` level number."""
    if level is None:
        return None
    if isinstance(level, str) and level.lower() in LEVELS:
        return LEVELS[level.lower()]
    if isinstance(level, int) and not isinstance(level, bool) and level >= 0:
        return level
    raise ConfigurationError(
        f"log_level={level!r} is not accepted; pass one of {list(LEVELS)} or a logging level number "
        "(e.g. logging.INFO), or None for info on the global-zero process and warnings elsewhere."
    )


def configure(level: int | None, *, is_global_zero: bool) -> None:
    """Set the ``drivetrain`` logger's level for this process and make sure its messages are shown."""
    logger.setLevel(level if level is not None else (logging.INFO if is_global_zero else logging.WARNING))
    if not logger.handlers and not _application_handlers():
        handler = _CurrentStderr()
        handler.setFormatter(logging.Formatter("drivetrain: %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False
