"""A ``tqdm`` bar per epoch; tqdm is optional, so it is imported only when the bar is built."""

from __future__ import annotations

import importlib
import sys
from typing import IO, Any

from .._common import ConfigurationError
from .base import ProgressCallback, epoch_number, format_results, format_value, of_total, total_epochs


def _import_tqdm() -> Any:
    try:
        return importlib.import_module("tqdm").tqdm
    except ImportError:
        raise ConfigurationError(
            "progress_bar='tqdm' needs the tqdm package, which is not installed; "
            "pip install tqdm, or use progress_bar='rich' or 'raw'."
        ) from None


class TqdmProgress(ProgressCallback):
    """One tqdm bar per epoch with the latest loss; evaluation results are written above it.

    Args:
        print_every: update the bar every that many batches.
        leave: keep each finished epoch's bar on screen.
        file: stream for the bars and the result lines (default: bars on ``sys.stderr`` and
            lines on ``sys.stdout``, as tqdm does).
    """

    def __init__(self, print_every: int = 1, leave: bool = True, file: IO[str] | None = None) -> None:
        super().__init__(print_every)
        self._tqdm = _import_tqdm()
        self.leave = bool(leave)
        self.file = file
        self._bar: Any = None

    def on_train_epoch_begin(self, trainer: Any) -> None:
        super().on_train_epoch_begin(trainer)
        self._close()
        self._bar = self._tqdm(
            total=trainer.num_batches_per_epoch,
            initial=trainer.batch_idx_in_epoch,
            desc=f"epoch {of_total(trainer.cur_epoch_idx + 1, total_epochs(trainer))}",
            leave=self.leave,
            file=self.file if self.file is not None else sys.stderr,
            dynamic_ncols=True,
        )

    def refresh(self, trainer: Any, finished_epoch: bool) -> None:
        bar = self._bar
        if bar is None:
            return
        loss = self.current_loss(trainer)
        if loss is not None:
            bar.set_postfix_str(f"loss={format_value(loss)}", refresh=False)
        epoch = of_total(epoch_number(trainer, finished_epoch), total_epochs(trainer))
        bar.set_description_str(f"epoch {epoch}", refresh=False)
        bar.update(trainer.batch_idx_in_epoch - bar.n)

    def on_train_epoch_end(self, trainer: Any) -> None:
        super().on_train_epoch_end(trainer)
        self._close()

    def show_results(self, trainer: Any, results: dict[str, Any]) -> None:
        line = f"evaluation at step {trainer.global_forward_batches}: {format_results(results) or '(no results)'}"
        self._tqdm.write(line, file=self.file if self.file is not None else sys.stdout)

    def on_train_end(self, trainer: Any) -> None:
        self._close()
        self._tqdm.write(self.summary(trainer), file=self.file if self.file is not None else sys.stdout)

    def on_exception(self, trainer: Any, exception: BaseException) -> None:
        super().on_exception(trainer, exception)
        self._close()

    def _close(self) -> None:
        bar, self._bar = self._bar, None
        if bar is not None:
            bar.close()
