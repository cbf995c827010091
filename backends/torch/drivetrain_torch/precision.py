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

from drivetrain.backend import DriverError, scaler_state_to_load

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

    def state(self) -> dict[str, Any] | None:
        """The GradScaler's state (scale, growth tracker: plain numbers) under fp16, else None."""
        return None if self.scaler is None else dict(self.scaler.state_dict())

    def load_state(self, state: Any) -> None:
        """Restore :meth:`state`, so the resumed run scales (and skips overflowing steps) exactly as before."""
        state = scaler_state_to_load(
            state, scaler=self.scaler is not None, expected=self.scaler is not None and self.scaler.is_enabled(),
            missing="the checkpoint has no grad scaler state (it was not saved with precision='fp16'); "
            "this run starts a fresh GradScaler, so its first steps may differ from a continued run.",
            ignored=f"the checkpoint holds a grad scaler state (saved with precision='fp16') but this run uses "
            f"precision={self.precision!r}, which needs no scaler; the state is ignored.")
        if state is None or self.scaler is None:
            return
        try:
            self.scaler.load_state_dict(dict(state))
        except (RuntimeError, KeyError) as exc:
            raise DriverError(f"load_precision_state: not a GradScaler state ({type(exc).__name__}: {exc}).") from exc


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
