"""drivetrain: one training loop, any deep-learning framework.

Importing this package imports no deep-learning framework; a framework is imported
only when its driver is chosen (``Trainer(..., driver="torch")``).
"""

from ._callbacks import Callback, CallbackError, rank_zero_only
from ._callbacks_lib import CheckpointCallback, EarlyStopCallback, LRSchedulerCallback, WarmupSchedule
from ._checkpoint import CheckpointError, StateEncodingError
from ._checkpoint.export import export_weights
from ._convert.api import load_weights
from ._convert.layout import TensorRule, WeightLayout
from ._convert.load import convert_weights
from ._driver import CONTRACT_VERSION, Capabilities, Driver
from ._errors import (
    BatchMismatchError,
    ConfigurationError,
    DistributedError,
    DriverError,
    DriverNotFoundError,
    DrivetrainError,
    EarlyStopException,
    PluginLoadError,
    TrainingTerminated,
)
from ._evaluator import Evaluator
from ._events import Event
from ._metrics import Accuracy, ClassifyFPreRecMetric, Metric, MetricInputError
from ._plugins import DriverSpec, available_drivers, hookimpl, register_plugin
from ._predict import load_predictions, predict
from ._progress import RawTextProgress, RichProgress, TqdmProgress
from ._sampler import ReproducibleBatchSampler
from ._seed import seed_everything
from ._trainer import Trainer
from ._version import __version__

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
    "EarlyStopException",
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
