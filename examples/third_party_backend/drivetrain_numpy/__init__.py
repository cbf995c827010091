"""drivetrain-numpy: an example third-party backend (numpy arrays, hand-written gradients).

The core's own tests use it as a framework-free driver; backend authors copy it as a template.
"""

from .data import ArrayLoader
from .model import LinearModel, NumpyLoss
from .optim import SGD

__all__ = ["ArrayLoader", "LinearModel", "NumpyLoss", "SGD"]
