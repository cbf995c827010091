"""Turn the Trainer's ``progress_bar=`` argument into a progress callback (or None)."""

from __future__ import annotations

import os
import sys
from typing import Any

from .._callbacks import Callback
from .._errors import ConfigurationError

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


def choose_progress(progress_bar: Any) -> Callback | None:
    """Return the progress callback ``progress_bar`` names.

    ``"auto"`` gives rich bars on an interactive terminal and plain lines
    elsewhere (pipes, files, ``CI=true``); ``"rich"``, ``"raw"``, ``"tqdm"`` force
    one; ``None``, ``False`` or ``"none"`` show nothing; a Callback instance (your
    own progress display) is used as given.
    """
    if isinstance(progress_bar, Callback):
        return progress_bar
    if progress_bar is None or progress_bar is False:
        return None
    name = progress_bar.strip().lower() if isinstance(progress_bar, str) else None
    if name == "auto":
        name = "rich" if stdout_is_terminal() and not in_ci() else "raw"
    if name == "none":
        return None
    if name == "raw":
        from .raw import RawTextProgress

        return RawTextProgress()
    if name == "rich":
        from .rich_bar import RichProgress

        return RichProgress()
    if name == "tqdm":
        from .tqdm_bar import TqdmProgress

        return TqdmProgress()
    raise ConfigurationError(
        f"progress_bar={progress_bar!r} is not accepted; use one of {', '.join(repr(a) for a in ACCEPTED)}, "
        "None/False for no progress display, or a progress Callback instance (e.g. RawTextProgress(print_every=10))."
    )
