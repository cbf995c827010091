"""drivetrain: one training loop, any deep-learning framework.

Importing this package imports no deep-learning framework; a framework is imported
only when its driver is chosen (``Trainer(..., driver="torch")``).
"""

from importlib.metadata import PackageNotFoundError as _PackageNotFoundError
from importlib.metadata import version as _version

from ._callbacks import Callback, CallbackError
from ._driver import CONTRACT_VERSION, Capabilities, Driver
from ._errors import (
    BatchMismatchError,
    ConfigurationError,
    DriverError,
    DriverNotFoundError,
    DrivetrainError,
    EarlyStopException,
    PluginLoadError,
)
from ._evaluator import Evaluator
from ._events import Event
from ._metrics import Accuracy, ClassifyFPreRecMetric, Metric
from ._plugins import DriverSpec, available_drivers, hookimpl, register_plugin
from ._progress import RawTextProgress, RichProgress, TqdmProgress
from ._trainer import Trainer

try:
    __version__ = _version("drivetrain")
except _PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+unknown"

__all__ = [
    "CONTRACT_VERSION",
    "Accuracy",
    "BatchMismatchError",
    "Callback",
    "CallbackError",
    "Capabilities",
    "ClassifyFPreRecMetric",
    "ConfigurationError",
    "Driver",
    "DriverError",
    "DriverNotFoundError",
    "DriverSpec",
    "DrivetrainError",
    "EarlyStopException",
    "Evaluator",
    "Event",
    "Metric",
    "PluginLoadError",
    "RawTextProgress",
    "RichProgress",
    "TqdmProgress",
    "Trainer",
    "__version__",
    "available_drivers",
    "hookimpl",
    "register_plugin",
]
