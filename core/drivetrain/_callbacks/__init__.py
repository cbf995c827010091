"""Callbacks: the Callback base and the manager that fires them, the events and their order, finding a monitored
value, and the built-in callbacks (checkpoints, early stopping, learning-rate schedules)."""

from .._common import check_keywords
from .base import Callback, CallbackError, CallbackManager, normalise_callbacks, rank_zero_only
from .checkpoint import CheckpointCallback, best_checkpoint, load_best_model
from .early_stop import EarlyStopCallback
from .events import Event, check_handler_signature
from .lr_scheduler import LRSchedulerCallback
from .monitor import find_monitor_value, validate_monitor
from .preemption import PreemptionCallback, preemption_for
from .schedule import WarmupSchedule

__all__ = ["PreemptionCallback", "preemption_for",
    "Callback", "CallbackError", "CallbackManager", "CheckpointCallback", "EarlyStopCallback", "Event",
    "LRSchedulerCallback", "WarmupSchedule", "best_checkpoint", "check_handler_signature",
    "find_monitor_value", "load_best_model", "normalise_callbacks", "rank_zero_only", "validate_monitor"
]

for _public in (CheckpointCallback, EarlyStopCallback, LRSchedulerCallback, PreemptionCallback, WarmupSchedule):
    check_keywords(_public)  # CheckpointCallback(every_n_epoch=1): "did you mean every_n_epochs=?"
