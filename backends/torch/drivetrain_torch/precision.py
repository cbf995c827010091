"""Mixed precision for the torch backend: which autocast to enter and whether a GradScaler is needed.

``fp32`` runs as is; ``bf16`` uses ``torch.autocast`` with bfloat16 (no scaler:
bf16 has fp32's exponent range); ``fp16`` uses float16 autocast plus a
``GradScaler`` so small gradients do not underflow.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch

from drivetrain._errors import DriverError

_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
SCALER_KWARGS = ("init_scale", "growth_factor", "backoff_factor", "growth_interval", "enabled")


class Precision:
    """The autocast factory and optional GradScaler for one precision on one device."""

    def __init__(
        self, precision: str, device: torch.device, scaler_kwargs: Mapping[str, Any] | None = None
    ) -> None:
        self.precision = precision
        self.device_type = device.type
        self.dtype = _DTYPES.get(precision)
        self.scaler: Any = None
        self._null = contextlib.nullcontext()
        self._make_autocast: Callable[[], contextlib.AbstractContextManager] | None = None
        if scaler_kwargs and precision != "fp16":
            raise DriverError(
                f"torch_kwargs['grad_scaler_kwargs'] only applies to precision='fp16', got precision={precision!r}; "
                "remove it or use precision='fp16'."
            )
        if self.dtype is None:
            return
        if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
            raise DriverError(
                f"precision='bf16' on {device}: this GPU does not support bfloat16 "
                "(it needs compute capability 8.0, Ampere, or newer); use precision='fp16'."
            )
        if precision == "fp16" and device.type == "cpu":
            warnings.warn(
                "precision='fp16' on CPU runs ~30x slower than fp32 (CPUs have few float16 kernels); "
                "use precision='bf16' on CPU.",
                UserWarning,
                stacklevel=4,
            )
        # A fresh autocast per use: an autocast object saves the previous state on itself,
        # so reusing one instance breaks when it is nested; building one costs < 1 us.
        self._make_autocast = functools.partial(torch.autocast, self.device_type, dtype=self.dtype)
        if precision == "fp16":
            self.scaler = _make_scaler(self.device_type, dict(scaler_kwargs or {}))

    def autocast(self) -> contextlib.AbstractContextManager:
        """A context that runs the forward in this precision (a shared no-op for fp32)."""
        if self._make_autocast is None:
            return self._null
        return self._make_autocast()


def _make_scaler(device_type: str, kwargs: dict[str, Any]) -> Any:
    unknown = sorted(set(kwargs) - set(SCALER_KWARGS))
    if unknown:
        raise DriverError(
            f"torch_kwargs['grad_scaler_kwargs'] has unknown key(s) {unknown}; accepted: {list(SCALER_KWARGS)}."
        )
    amp_scaler = getattr(torch.amp, "GradScaler", None)
    if amp_scaler is not None:
        return amp_scaler(device_type, **kwargs)
    if device_type == "cuda":  # torch < 2.3
        return torch.cuda.amp.GradScaler(**kwargs)
    raise DriverError(
        f"precision='fp16' on CPU needs torch>=2.3 for a CPU GradScaler (this is torch {torch.__version__}); "
        "use precision='bf16' on CPU."
    )
