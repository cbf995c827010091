"""drivetrain's OneFlow backend (Python 3.10, oneflow 0.9.0).

Importing this package is cheap and does not import oneflow: the driver module
(:mod:`drivetrain_oneflow.driver`) is loaded only when ``driver="oneflow"`` (or
``"auto"`` with a ``oneflow.nn.Module``) is chosen.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
