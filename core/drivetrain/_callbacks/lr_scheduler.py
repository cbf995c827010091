"""LRSchedulerCallback: step any framework's learning-rate scheduler from the loop."""

from __future__ import annotations

from typing import Any

from .._common import ConfigurationError
from .base import Callback

STEP_ON = ("batch", "epoch")
_OWNER = "LRSchedulerCallback"


class LRSchedulerCallback(Callback):
    """Call ``scheduler.step()`` after every real optimizer step (``step_on="batch"``) or every epoch.

    "batch" follows the optimizer, not the dataloader: with ``accumulation_steps=k``
    the scheduler steps once per k batches, exactly when the optimizer does. The
    scheduler's ``state_dict()`` travels in checkpoints and comes back through
    ``load_state_dict`` (or paddle's ``set_state_dict``), so a resumed run continues
    the schedule. Any object with ``step()`` works: torch.optim.lr_scheduler.*,
    paddle.optimizer.lr.*, or your own.

    Args:
        scheduler: the scheduler, built on the Trainer's optimizer.
        step_on: ``"batch"``: after every optimizer step; ``"epoch"``: at the end of every epoch.

    Raises:
        ConfigurationError: the scheduler has no ``step()``, or ``step_on`` is neither value.
    """

    def __init__(self, scheduler: Any, step_on: str = "batch") -> None:
        if not callable(getattr(scheduler, "step", None)):
            raise ConfigurationError(
                f"{_OWNER}(scheduler={scheduler!r}) is not accepted: it has no step() method; pass a "
                "learning-rate scheduler such as torch.optim.lr_scheduler.StepLR(optimizer, ...)."
            )
        if step_on not in STEP_ON:
            raise ConfigurationError(
                f"{_OWNER}(step_on={step_on!r}) is not accepted; pass 'batch' (after every optimizer step) "
                "or 'epoch' (at the end of every epoch)."
            )
        self.scheduler = scheduler
        self.step_on = step_on

    def on_after_optimizers_step(self, trainer: Any, optimizers: Any) -> None:
        if self.step_on == "batch":
            self.scheduler.step()

    def on_train_epoch_end(self, trainer: Any) -> None:
        if self.step_on == "epoch":
            self.scheduler.step()

    def on_save_checkpoint(self, trainer: Any) -> Any:
        state_dict = getattr(self.scheduler, "state_dict", None)
        if not callable(state_dict):
            raise ConfigurationError(
                f"{_OWNER}: {type(self.scheduler).__name__} has no state_dict(), so a checkpoint could not "
                "resume its schedule; give the scheduler state_dict()/load_state_dict() or do not save "
                "full checkpoints with this callback."
            )
        return state_dict()

    def on_load_checkpoint(self, trainer: Any, states: Any) -> None:
        if states is None:
            return
        load = getattr(self.scheduler, "load_state_dict", None) or getattr(self.scheduler, "set_state_dict", None)
        if not callable(load):
            raise ConfigurationError(
                f"{_OWNER}: {type(self.scheduler).__name__} has neither load_state_dict() nor set_state_dict(), "
                "so the checkpoint's schedule cannot be restored; add one of them to the scheduler."
            )
        load(states)
