"""Shared basics every folder may use: the error classes, the version, the ``drivetrain`` logger, "did you mean"
suggestions, argument checks and atomic file writes."""

from .atomic import atomic_write, fsync_dir, start_writeback
from .errors import (
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
)
from .log import check_log_level, configure, ignore_framework_log_format, logger
from .options import (
    PRECISIONS,
    bool_option,
    check_int,
    check_keywords,
    check_optional_callable,
    parameter_names,
    resolve_precision,
    split_backend_kwargs,
    unknown_arguments_error,
)
from .public_names import public_name
from .suggest import MissingAttribute, close_matches, did_you_mean, stands_for
from .version import __version__

__all__ = [
    "BatchMismatchError", "ConfigurationError", "DistributedError", "DriverError", "DriverNotFoundError",
    "DrivetrainError", "EarlyStopException", "Preempted", "MissingAttribute", "PRECISIONS", "PluginLoadError",
    "TrainingTerminated", "__version__", "atomic_write", "bool_option", "check_int", "check_keywords",
    "check_log_level", "check_optional_callable", "close_matches", "configure", "did_you_mean", "fsync_dir",
    "ignore_framework_log_format", "logger", "parameter_names", "public_name", "resolve_precision",
    "split_backend_kwargs", "stands_for", "start_writeback", "unknown_arguments_error"
]
