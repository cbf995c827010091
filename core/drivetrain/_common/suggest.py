""""Did you mean ...?" for a misspelt name: one rule for arguments, events and driver names."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping


def close_matches(name: str, candidates: Iterable[str], n: int = 1) -> list[str]:
    """The accepted names closest to ``name`` (difflib's ratio >= 0.6), best first; empty when none is close."""
    return difflib.get_close_matches(name, list(candidates), n=n)


class MissingAttribute(AttributeError):
    """The AttributeError of a ``__getattr__`` whose message suggests the fix: what ``habits`` says for a name
    other libraries use (``{"fit": "trains with trainer.run()"}``), else the closest public attribute. The
    suggestion is worked out only when the message is read: ``getattr(obj, name, default)`` stays cheap."""

    def __init__(self, obj: object, name: str, habits: Mapping[str, str]) -> None:
        super().__init__(f"{type(obj).__name__!r} object has no attribute {name!r}", name=name, obj=obj)
        self._habits = habits

    def __str__(self) -> str:
        message, name = self.args[0], self.name or ""
        if name.startswith("_"):  # copy, pickle and hasattr probe private names: nothing to suggest
            return message
        if name in self._habits:
            return f"{message}; {self._habits[name]}"
        public = {n for n in (*dir(type(self.obj)), *vars(self.obj)) if not n.startswith("_")}
        return message + did_you_mean(name, public)


def did_you_mean(name: str, candidates: Iterable[str], n: int = 1) -> str:
    """``" Did you mean 'x'?"`` (or ``'x' or 'y'``), to append to a message; ``""`` when nothing is close."""
    close = [repr(c) for c in close_matches(name, candidates, n)]
    if not close:
        return ""
    return f" Did you mean {close[0] if len(close) == 1 else ', '.join(close[:-1]) + ' or ' + close[-1]}?"


def stands_for(name: str, candidates: Iterable[str]) -> list[str]:
    """The candidates close to ``name`` (as :func:`close_matches`) or standing for it as a short form, one the
    start of the other (``"acc"`` for ``"accuracy"``): a name another library spells out in full. Best first."""
    pool = list(candidates)
    close = close_matches(name, pool, n=len(pool))
    lowered = name.lower()
    short = [c for c in pool if c not in close and min(len(c), len(name)) >= 3
             and (lowered.startswith(c.lower()) or c.lower().startswith(lowered))]
    return close + short
