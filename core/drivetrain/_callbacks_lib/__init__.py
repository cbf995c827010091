"""Built-in callbacks: checkpoints, early stopping and learning-rate schedules."""

from .checkpoint import CheckpointCallback
from .early_stop import EarlyStopCallback
from .lr_scheduler import LRSchedulerCallback
from .schedule import WarmupSchedule

__all__ = ["CheckpointCallback", "EarlyStopCallback", "LRSchedulerCallback", "WarmupSchedule"]
