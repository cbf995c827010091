"""drivetrain's JAX backend: drives ``flax.nnx.Module`` models with an ``nnx.Optimizer`` over optax.

Importing this package is cheap and does not import jax: the driver module is loaded only when ``driver="jax"``
(or ``"auto"`` with an ``nnx.Module``) is chosen. :class:`DataLoader` and :func:`numpy_collate` batch a map-style
dataset into numpy arrays without any other framework.
"""

from __future__ import annotations

from .data import DataLoader, numpy_collate

__version__ = "0.1.0"

__all__ = ["DataLoader", "__version__", "numpy_collate"]
