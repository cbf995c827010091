"""The installed drivetrain version, read once from package metadata."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("drivetrain")
except PackageNotFoundError:  # a source tree that is not installed
    __version__ = "0.0.0+unknown"
