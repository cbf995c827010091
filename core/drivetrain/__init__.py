"""drivetrain: one training loop, any deep-learning framework.

Importing this package imports no deep-learning framework; a framework is imported
only when its driver is chosen (``Trainer(..., driver="torch")``).
"""

from ._callbacks import (
    Callback,
    CallbackError,
    CheckpointCallback,
    EarlyStopCallback,
    Event,
    LRSchedulerCallback,
    PreemptionCallback,
    WarmupSchedule,
    rank_zero_only,
)
from ._checkpoint import export_weights, load_weights
from ._common import (
    BatchMismatchError,
    ConfigurationError,
    DistributedError,
    DriverError,
    DriverNotFoundError,
    DrivetrainError,
    EarlyStopException,
    PluginLoadError,
    Preempted,
    TrainingTerminated,
    __version__,
)
from ._convert import convert_weights
from ._data import ReproducibleBatchSampler
from ._format import CheckpointError, StateEncodingError
from ._loop import Evaluator, Trainer, load_predictions, predict
from ._metrics import Accuracy, ClassifyFPreRecMetric, Metric, MetricInputError
from ._progress import RawTextProgress, RichProgress, TqdmProgress
from .backend import (
    CONTRACT_VERSION,
    Capabilities,
    Driver,
    DriverSpec,
    TensorRule,
    WeightLayout,
    available_drivers,
    hookimpl,
    register_plugin,
    seed_everything,
)

__all__ = [
    "CONTRACT_VERSION",
    "Accuracy",
    "BatchMismatchError",
    "Callback",
    "CallbackError",
    "CheckpointCallback",
    "CheckpointError",
    "Capabilities",
    "ClassifyFPreRecMetric",
    "ConfigurationError",
    "Driver",
    "DistributedError",
    "DriverError",
    "DriverNotFoundError",
    "DriverSpec",
    "DrivetrainError",
    "EarlyStopCallback",
    "PreemptionCallback",
    "EarlyStopException",
    "Preempted",
    "TrainingTerminated",
    "Evaluator",
    "Event",
    "LRSchedulerCallback",
    "Metric",
    "MetricInputError",
    "PluginLoadError",
    "RawTextProgress",
    "ReproducibleBatchSampler",
    "RichProgress",
    "StateEncodingError",
    "TensorRule",
    "TqdmProgress",
    "Trainer",
    "WarmupSchedule",
    "WeightLayout",
    "__version__",
    "available_drivers",
    "convert_weights",
    "export_weights",
    "hookimpl",
    "load_predictions",
    "load_weights",
    "predict",
    "rank_zero_only",
    "register_plugin",
    "seed_everything",
]
