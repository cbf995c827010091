"""drivetrain's PyTorch backend.

Importing this package is cheap and does not import torch: the driver module
(:mod:`drivetrain_torch.driver`) is loaded only when ``driver="torch"`` (or
``"auto"`` with a torch model) is chosen.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
