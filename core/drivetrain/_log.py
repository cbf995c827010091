"""drivetrain's own messages: the ``drivetrain`` logger, its level per rank, and a handler that
writes where a progress bar expects it.

Messages go through ``logging.getLogger("drivetrain")``, so an application that configures
logging routes them like its own. When it has not (no handler on the ``drivetrain`` logger
or the root logger), drivetrain adds one that writes ``drivetrain: <message>`` lines to the
*current* ``sys.stderr`` at each message: a live rich progress bar redirects that stream
above its bars, so messages never tear a redraw. ``Trainer(log_level=...)`` sets the level;
by default the global-zero process shows ``info`` and the other ranks only warnings.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from ._errors import ConfigurationError

logger = logging.getLogger("drivetrain")

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR,
          "critical": logging.CRITICAL}


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
    if not logger.handlers and not logging.getLogger().handlers:
        handler = _CurrentStderr()
        handler.setFormatter(logging.Formatter("drivetrain: %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False
