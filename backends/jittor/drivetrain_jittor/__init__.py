"""drivetrain's Jittor backend.

Importing this package is cheap and does not import jittor: the driver module
(:mod:`drivetrain_jittor.driver`) is loaded only when ``driver="jittor"`` (or
``"auto"`` with a ``jittor.Module``) is chosen. :func:`import_jittor` imports jittor
with the environment this kind of machine needs (see :mod:`drivetrain_jittor._import`).
"""

from __future__ import annotations

from ._import import import_jittor, prepare_environment
from .scheduler import ResumableScheduler

__version__ = "0.1.0"

__all__ = ["ResumableScheduler", "__version__", "import_jittor", "prepare_environment"]
