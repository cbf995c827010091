"""drivetrain's PaddlePaddle backend.

Importing this package is cheap and does not import paddle: the driver module
(:mod:`drivetrain_paddle.driver`) is loaded only when ``driver="paddle"`` (or
``"auto"`` with a ``paddle.nn.Layer``) is chosen, and :func:`export_inference_model`
imports paddle when it is first used.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

__all__ = ["__version__", "export_inference_model"]


def __getattr__(name: str) -> Any:
    if name == "export_inference_model":
        from .static import export_inference_model

        return export_inference_model
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
