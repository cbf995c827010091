"""Turn the Trainer's ``progress_bar=`` argument into a progress callback (or None)."""

from __future__ import annotations

import os
import sys
from typing import Any

from .._callbacks import Callback
from .._common import ConfigurationError

ACCEPTED = ("auto", "rich", "raw", "tqdm", "none")


def in_ci() -> bool:
    """Whether the environment variable ``CI`` says we run under continuous integration."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes", "on")


def stdout_is_terminal() -> bool:
    isatty = getattr(sys.stdout, "isatty", None)
    try:
        return bool(isatty()) if callable(isatty) else False
    except (ValueError, OSError):  # a closed or detached stream
        return False


def display_kind(progress_bar: Any) -> str:
    """``"rich"``, ``"raw"``, ``"tqdm"`` or ``"none"`` for a ``progress_bar=`` value that is not an object.

    ``"auto"`` gives rich bars on an interactive terminal and plain lines elsewhere
    (pipes, files, ``CI=true``); ``None``, ``False`` and ``"none"`` show nothing.
    """
    if progress_bar is None or progress_bar is False:
        return "none"
    name = progress_bar.strip().lower() if isinstance(progress_bar, str) else None
    if name == "auto":
        return "rich" if stdout_is_terminal() and not in_ci() else "raw"
    if name in ("none", "raw", "rich", "tqdm"):
        return name
    raise ConfigurationError(
        f"progress_bar={progress_bar!r} is not accepted; use one of {', '.join(repr(a) for a in ACCEPTED)}, "
        "None/False for no progress display, or a progress Callback instance (e.g. RawTextProgress(print_every=10))."
    )


def choose_progress(progress_bar: Any) -> Callback | None:
    """Return the progress callback ``progress_bar`` names (see :func:`display_kind`).

    A Callback instance (your own progress display) is used as given.
    """
    if isinstance(progress_bar, Callback):
        return progress_bar
    name = display_kind(progress_bar)
    if name == "raw":
        from .raw import RawTextProgress

        return RawTextProgress()
    if name == "rich":
        from .rich_bar import RichProgress

        return RichProgress()
    if name == "tqdm":
        from .tqdm_bar import TqdmProgress

        return TqdmProgress()
    return None
