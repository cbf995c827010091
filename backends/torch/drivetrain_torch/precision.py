"""Mixed precision for the torch backend: which autocast to enter and whether a GradScaler is needed.

``fp32`` runs as is; ``bf16`` uses ``torch.autocast`` with bfloat16 (no scaler:
bf16 has fp32's exponent range); ``fp16`` uses float16 autocast plus a
``GradScaler`` so small gradients do not underflow.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Mapping
from typing import Any

import torch

from drivetrain.backend import AmpPrecision, DriverError, no_bf16_error, scaler_options

PRECISION_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
"""The torch dtype of each low precision the Trainer names (fp32 has none: nothing is cast)."""
_ARGUMENT = "torch_kwargs['grad_scaler_kwargs']"
SCALER_KWARGS = ("init_scale", "growth_factor", "backoff_factor", "growth_interval", "enabled")


class Precision(AmpPrecision):
    """The autocast factory and optional GradScaler for one precision on one device."""

    def __init__(
        self, precision: str, device: torch.device, scaler_kwargs: Mapping[str, Any] | None = None
    ) -> None:
        super().__init__(precision)
        self.device_type = device.type
        self.dtype = PRECISION_DTYPES.get(precision)
        if precision == "fp16" and device.type == "cpu":
            warnings.warn(
                "precision='fp16' on CPU runs ~30x slower than fp32 (CPUs have few float16 kernels); "
                "use precision='bf16' on CPU.",
                UserWarning,
                stacklevel=4,
            )
        scaler_kwargs = scaler_options(scaler_kwargs or None, precision, _ARGUMENT, SCALER_KWARGS)
        if self.dtype is None:
            return
        if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
            raise no_bf16_error(device)
        self.make_autocast = functools.partial(torch.autocast, self.device_type, dtype=self.dtype)
        if precision == "fp16":
            self.scaler = _make_scaler(self.device_type, scaler_kwargs)

    def wants_state(self) -> bool:
        return self.scaler is not None and self.scaler.is_enabled()

    def load_scaler(self, state: Mapping[str, Any]) -> None:
        try:
            self.scaler.load_state_dict(dict(state))
        except (RuntimeError, KeyError) as exc:
            raise DriverError(f"load_precision_state: not a GradScaler state ({type(exc).__name__}: {exc}).") from exc


def _make_scaler(device_type: str, kwargs: dict[str, Any]) -> Any:
    amp_scaler = getattr(torch.amp, "GradScaler", None)
    if amp_scaler is not None:
        return amp_scaler(device_type, **kwargs)
    if device_type == "cuda":  # torch < 2.3
        return torch.cuda.amp.GradScaler(**kwargs)
    raise DriverError(
        f"precision='fp16' on CPU needs torch>=2.3 for a CPU GradScaler (this is torch {torch.__version__}); "
        "use precision='bf16' on CPU."
    )
