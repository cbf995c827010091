"""A framework-free drivetrain backend for testing the core: numpy arrays, hand-written gradients."""

from .data import ArrayLoader
from .model import LinearModel, NumpyLoss
from .optim import SGD

__all__ = ["ArrayLoader", "LinearModel", "NumpyLoss", "SGD"]
