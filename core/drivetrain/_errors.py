"""Exception classes a user may want to catch; every message names the argument and the fix."""

from __future__ import annotations


class DrivetrainError(Exception):
    """Base class of every error drivetrain raises on purpose."""


class ConfigurationError(DrivetrainError, ValueError):
    """A Trainer/Evaluator argument is wrong; raised at construction, before any work."""


class DriverNotFoundError(DrivetrainError, ValueError):
    """The requested driver is unknown or its backend is not installed."""


class DriverError(DrivetrainError, ValueError):
    """A driver rejected an input (device, optimizer, precision, ...)."""


class BatchMismatchError(DrivetrainError, TypeError):
    """A batch does not fit the parameters of the function it is passed to."""


class DistributedError(DrivetrainError, RuntimeError):
    """A collective failed because another process failed, was killed or stopped answering;
    the message names that rank and what it reported."""


class PluginLoadError(DrivetrainError, ImportError):
    """A backend plugin failed to load while strict plugin loading is on."""


class EarlyStopException(DrivetrainError):
    """Raised by a callback to end training cleanly; the Trainer catches it."""
