"""Built-in callbacks: checkpoints, early stopping and learning-rate schedules."""

from .._options import check_keywords
from .checkpoint import CheckpointCallback
from .early_stop import EarlyStopCallback
from .lr_scheduler import LRSchedulerCallback
from .schedule import WarmupSchedule

__all__ = ["CheckpointCallback", "EarlyStopCallback", "LRSchedulerCallback", "WarmupSchedule"]

for _public in (CheckpointCallback, EarlyStopCallback, LRSchedulerCallback, WarmupSchedule):
    check_keywords(_public)  # CheckpointCallback(every_n_epoch=1): "did you mean every_n_epochs=?"
