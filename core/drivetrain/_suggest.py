""""Did you mean ...?" for a misspelt name: one rule for arguments, events and driver names."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def close_matches(name: str, candidates: Iterable[str], n: int = 1) -> list[str]:
    """The accepted names closest to ``name`` (difflib's ratio >= 0.6), best first; empty when none is close."""
    return difflib.get_close_matches(name, list(candidates), n=n)


def did_you_mean(name: str, candidates: Iterable[str], n: int = 1) -> str:
    """``" Did you mean 'x'?"`` (or ``'x' or 'y'``), to append to a message; ``""`` when nothing is close."""
    close = [repr(c) for c in close_matches(name, candidates, n)]
    if not close:
        return ""
    return f" Did you mean {close[0] if len(close) == 1 else ', '.join(close[:-1]) + ' or ' + close[-1]}?"
