"""Plain-text progress: one line per refresh, for logs, CI and anything that is not a terminal."""

from __future__ import annotations

import sys
from typing import IO, Any

from .base import ProgressCallback, epoch_number, format_results, format_value, of_total, total_epochs


class RawTextProgress(ProgressCallback):
    """Print ``epoch 1/3  batch 50/200  step 50/600  loss 0.4312`` every ``print_every`` batches.

    Also prints a line after each evaluation and a summary when training ends: how it
    ended (finished, stopped early, or stopped by an exception), how long it took, the
    last loss and the last evaluation.

    Args:
        print_every: print a line every that many batches.
        file: the stream to print to (default: the current ``sys.stdout``, looked up at print time, so
            redirection and pytest's capture work).

    Raises:
        ConfigurationError: ``print_every`` is not an int >= 1.
    """

    def __init__(self, print_every: int = 50, file: IO[str] | None = None) -> None:
        super().__init__(print_every)
        self.file = file

    def _print(self, line: str) -> None:
        print(line, file=self.file if self.file is not None else sys.stdout, flush=True)

    def on_train_begin(self, trainer: Any) -> None:
        super().on_train_begin(trainer)
        per_epoch, epochs = trainer.num_batches_per_epoch, total_epochs(trainer)
        plan = [f"{epochs} epoch{'s' if epochs != 1 else ''}" if epochs else "", f"{per_epoch} batches per epoch" if per_epoch else ""]
        if not epochs and trainer.n_batches:
            plan.append(f"{trainer.n_batches} batches in all")
        self._print("training: " + (", ".join(p for p in plan if p) or "until the data ends"))

    def refresh(self, trainer: Any, finished_epoch: bool) -> None:
        parts = [
            f"epoch {of_total(epoch_number(trainer, finished_epoch), total_epochs(trainer))}",
            f"batch {of_total(trainer.batch_idx_in_epoch, trainer.num_batches_per_epoch)}",
            f"step {of_total(trainer.global_forward_batches, trainer.n_batches)}",
        ]
        loss = self.current_loss(trainer)
        if loss is not None:
            parts.append(f"loss {format_value(loss)}")
        self._print("  ".join(parts))

    def show_results(self, trainer: Any, results: dict[str, Any]) -> None:
        self._print(f"evaluation at step {trainer.global_forward_batches}: {format_results(results) or '(no results)'}")

    def on_train_end(self, trainer: Any) -> None:
        self._print(self.summary(trainer))
