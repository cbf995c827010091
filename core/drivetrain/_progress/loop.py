"""Progress of an inner loop (an evaluation or a prediction): a bar or a line now and then.

The Trainer's progress callbacks show epochs and batches; a long evaluation inside
them, or a standalone Evaluator / prediction, shows its own progress through a
:class:`LoopDisplay` of the same kind: a rich task on the trainer's live display, a
tqdm bar that clears itself, or a plain line at most every ``interval`` seconds (so
a quick evaluation prints nothing extra in logs).
"""

from __future__ import annotations

import sys
import time
from typing import IO, Any

from .._callbacks import Callback
from .choose import display_kind


class LoopDisplay:
    """Shows nothing: the base class and the display for ``progress_bar=None``."""

    def start(self, description: str, total: int | None) -> None:
        """A loop over ``total`` batches (None: unknown) begins."""

    def advance(self) -> None:
        """One batch is done."""

    def finish(self) -> None:
        """The loop ended (normally or by an exception)."""


class RawLoopDisplay(LoopDisplay):
    """``evaluate dev: 120/500 batches`` at most every ``interval`` seconds."""

    def __init__(self, interval: float = 10.0, file: IO[str] | None = None) -> None:
        self.interval = interval
        self.file = file
        self._description = ""
        self._total: int | None = None
        self._done = 0
        self._next_print = 0.0

    def start(self, description: str, total: int | None) -> None:
        self._description, self._total, self._done = description, total, 0
        self._next_print = time.perf_counter() + self.interval

    def advance(self) -> None:
        self._done += 1
        now = time.perf_counter()
        if now >= self._next_print:
            self._next_print = now + self.interval
            total = f"/{self._total}" if self._total else ""
            print(f"{self._description}: {self._done}{total} batches", flush=True,
                  file=self.file if self.file is not None else sys.stdout)


class TqdmLoopDisplay(LoopDisplay):
    """A tqdm bar that disappears when the loop ends."""

    def __init__(self) -> None:
        self._bar: Any = None

    def start(self, description: str, total: int | None) -> None:
        from tqdm.auto import tqdm

        self._bar = tqdm(total=total, desc=description, leave=False, unit="batch", dynamic_ncols=True)

    def advance(self) -> None:
        if self._bar is not None:
            self._bar.update(1)

    def finish(self) -> None:
        bar, self._bar = self._bar, None
        if bar is not None:
            bar.close()


class RichLoopDisplay(LoopDisplay):
    """A rich task: on the Trainer's live display when it has one, else on a display of its own."""

    def __init__(self, owner: Any = None) -> None:
        self._owner = owner  # a RichProgress whose live display the task joins
        self._progress: Any = None
        self._own = False
        self._task: Any = None

    def start(self, description: str, total: int | None) -> None:
        progress = getattr(self._owner, "_progress", None)
        self._own = progress is None
        if progress is None:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                TimeElapsedColumn(), transient=True)
            progress.start()
        self._progress = progress
        self._task = progress.add_task(description, total=total)

    def advance(self) -> None:
        if self._progress is not None:
            self._progress.advance(self._task)

    def finish(self) -> None:
        progress, self._progress = self._progress, None
        if progress is None:
            return
        if self._own:
            progress.stop()
        else:
            progress.remove_task(self._task)


def choose_loop_display(progress_bar: Any) -> LoopDisplay:
    """The display for an Evaluator's or a prediction's ``progress_bar=`` (the Trainer's values).

    A progress Callback (the Trainer's own display) gives the matching kind: a rich
    trainer shows the evaluation as a task of its live display.
    """
    from .raw import RawTextProgress
    from .rich_bar import RichProgress
    from .tqdm_bar import TqdmProgress

    if isinstance(progress_bar, LoopDisplay):
        return progress_bar
    if isinstance(progress_bar, RichProgress):
        return RichLoopDisplay(progress_bar)
    if isinstance(progress_bar, TqdmProgress):
        return TqdmLoopDisplay()
    if isinstance(progress_bar, RawTextProgress):
        return RawLoopDisplay(file=progress_bar.file)
    if isinstance(progress_bar, Callback):
        return LoopDisplay()  # a display of the user's own: it shows what it wants through the events
    kinds = {"raw": RawLoopDisplay, "rich": RichLoopDisplay, "tqdm": TqdmLoopDisplay, "none": LoopDisplay}
    return kinds[display_kind(progress_bar)]()
