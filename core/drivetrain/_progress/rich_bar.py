"""Progress bars drawn with ``rich``: one bar for epochs, one for the batches of the current epoch."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Column
from rich.text import Text

from .base import ProgressCallback, epoch_number, format_results, format_value, total_epochs

_RESULTS_ON_BAR = 3


class _InfoColumn(ProgressColumn):
    """The loss or results text of a task; a task without one (an evaluation's, added to this display) shows none."""

    def render(self, task: Task) -> Text:
        return Text(str(task.fields.get("info", "")))


class RichProgress(ProgressCallback):
    """Live epoch and batch bars with the latest loss and evaluation results.

    Args:
        print_every: update the batch bar every that many batches.
        leave: keep the finished bars on screen (False clears them at the end).
        console: the ``rich.console.Console`` to draw on (default: rich's global console on stdout).

    The live display is stopped in ``on_train_end`` and ``on_exception``, so the
    terminal is given back even when training fails; the summary line then says what
    stopped it.
    """

    def __init__(self, print_every: int = 1, leave: bool = True, console: Console | None = None) -> None:
        super().__init__(print_every)
        self.leave = bool(leave)
        self.console = console
        self._progress: Progress | None = None
        self._epoch_task: TaskID | None = None
        self._batch_task: TaskID | None = None

    # ----------------------------------------------------------- lifecycle
    def on_train_begin(self, trainer: Any) -> None:
        super().on_train_begin(trainer)
        self._stop()
        self._progress = Progress(
            TextColumn("{task.description}", style="bold", table_column=Column(no_wrap=True, min_width=8)),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("<"),
            TimeRemainingColumn(),
            _InfoColumn(table_column=Column(no_wrap=True, overflow="ellipsis")),
            console=self.console,
            transient=not self.leave,
        )
        self._epoch_task = self._progress.add_task(
            "epochs", total=total_epochs(trainer), completed=trainer.cur_epoch_idx, info=""
        )
        self._batch_task = self._progress.add_task(
            f"epoch {trainer.cur_epoch_idx + 1}", total=trainer.num_batches_per_epoch, info=""
        )
        self._progress.start()

    def on_train_epoch_begin(self, trainer: Any) -> None:
        super().on_train_epoch_begin(trainer)
        if self._progress is not None and self._batch_task is not None:
            self._progress.reset(
                self._batch_task,
                total=trainer.num_batches_per_epoch,
                completed=trainer.batch_idx_in_epoch,
                description=f"epoch {trainer.cur_epoch_idx + 1}",
            )

    def on_train_epoch_end(self, trainer: Any) -> None:
        super().on_train_epoch_end(trainer)
        if self._progress is not None and self._epoch_task is not None:
            self._progress.update(self._epoch_task, completed=trainer.cur_epoch_idx)

    def on_train_end(self, trainer: Any) -> None:
        self._stop()
        self._console().print(Text(self.summary(trainer)))

    def on_exception(self, trainer: Any, exception: BaseException) -> None:
        super().on_exception(trainer, exception)
        self._stop()

    def _stop(self) -> None:
        progress, self._progress = self._progress, None
        if progress is not None:
            progress.stop()

    def _console(self) -> Console:
        if self._progress is not None:
            return self._progress.console
        if self.console is None:
            self.console = Console()
        return self.console

    # ------------------------------------------------------------- drawing
    def refresh(self, trainer: Any, finished_epoch: bool) -> None:
        if self._progress is None or self._batch_task is None:
            return
        loss = self.current_loss(trainer)
        info = "" if loss is None else f"loss {format_value(loss)}"
        self._progress.update(
            self._batch_task,
            completed=trainer.batch_idx_in_epoch,
            description=f"epoch {epoch_number(trainer, finished_epoch)}",
            info=info,
        )

    def show_results(self, trainer: Any, results: dict[str, Any]) -> None:
        text = format_results(results) or "(no results)"
        if self._progress is not None and self._epoch_task is not None:
            # The bar shows the first few results; the full line is printed above the bars.
            shown = dict(list(results.items())[:_RESULTS_ON_BAR])
            more = " …" if len(results) > _RESULTS_ON_BAR else ""
            self._progress.update(self._epoch_task, info=format_results(shown) + more)
        prefix = f"evaluation at step {trainer.global_forward_batches}: "
        self._console().print(Text.assemble((prefix, "bold"), text))
