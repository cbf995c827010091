"""Mixed precision for the paddle backend: ``paddle.amp.auto_cast``, ``paddle.amp.decorate`` and ``GradScaler``.

``fp16`` runs the forward under ``paddle.amp.auto_cast(dtype="float16")`` and scales
the loss with a ``paddle.amp.GradScaler`` (its settings are Wenxin's:
``init_loss_scaling``, ``incr_ratio``, ``decr_ratio``, ``incr_every_n_steps``,
``decr_every_n_nan_or_inf``). ``bf16`` uses bfloat16 and no scaler (bf16 has fp32's
exponent range). ``amp_level="O1"`` (default) casts per op from paddle's lists;
``"O2"`` casts the parameters too (``paddle.amp.decorate``) with fp32 master weights in
the optimizer.

On the CPU paddle has no float16 or bfloat16 kernels: ``auto_cast`` silently does
nothing and ``GradScaler`` disables itself. The driver says so once, with a warning,
and trains in fp32 -- it does not pretend.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Mapping
from typing import Any

import paddle

from drivetrain.backend import AmpPrecision, DriverError, check_scaler_values, no_bf16_error, scaler_options

from ._device import Device

_DTYPES = {"fp16": "float16", "bf16": "bfloat16"}
AMP_LEVELS = ("O1", "O2")
SCALER_KWARGS: dict[str, str] = {  # each description starts with the rule check_scaler_values applies
    "init_loss_scaling": "float > 0: the initial loss scale (paddle's default 65536.0; Wenxin used 1.0)",
    "incr_ratio": "float > 1: multiplier when the scale grows",
    "decr_ratio": "float in (0, 1): multiplier when the scale shrinks",
    "incr_every_n_steps": "int >= 1: grow the scale after this many steps with finite gradients",
    "decr_every_n_nan_or_inf": "int >= 1: shrink the scale after this many steps with inf/nan gradients",
    "use_dynamic_loss_scaling": "bool: adapt the scale (True) or keep it fixed (False)",
}


class Precision(AmpPrecision):
    """The autocast factory, optional GradScaler and O2 decoration for one precision on one device."""

    saved_with = "precision='fp16' on a GPU"

    def __init__(self, precision: str, device: Device, amp_level: str | None = None,
                 scaler_kwargs: Mapping[str, Any] | None = None) -> None:
        super().__init__(precision)
        self.dtype = _DTYPES.get(precision)
        self.level: str | None = None
        self.enabled = False
        scaler_kwargs = scaler_options(scaler_kwargs or None, precision, f"paddle_kwargs {sorted(scaler_kwargs or ())}",
                                       SCALER_KWARGS)  # the fp16 loss scaler's: refused under fp32 and bf16
        if self.dtype is None:
            if amp_level is not None:
                raise DriverError("paddle_kwargs ['amp_level'] configure mixed precision, but precision='fp32'; pass "
                                  "fp16=True or precision='fp16'/'bf16', or remove it.")
            return
        self.level = "O1" if amp_level is None else amp_level
        if self.level not in AMP_LEVELS:
            raise DriverError(
                f"paddle_kwargs['amp_level']={amp_level!r} is not accepted; use 'O1' (cast per op, default) or "
                "'O2' (fp16/bf16 parameters with fp32 master weights)."
            )
        check_scaler_values(scaler_kwargs, SCALER_KWARGS, "paddle_kwargs")
        self.enabled = device.kind == "gpu"
        if not self.enabled:
            warnings.warn(
                f"precision={precision!r} on CPU: paddle has no {self.dtype} kernels on the CPU "
                "(paddle.amp.auto_cast does nothing there), so this run trains in fp32. Use a GPU for mixed "
                "precision, or precision='fp32' to silence this warning.",
                UserWarning,
                stacklevel=4,
            )
            return
        if precision == "bf16" and not paddle.amp.is_bfloat16_supported(device.place()):
            raise no_bf16_error(device)
        if precision == "fp16" and not paddle.amp.is_float16_supported(device.place()):
            raise DriverError(f"precision='fp16' on {device}: paddle reports no float16 support on this GPU; use "
                              "precision='fp32'.")
        self.make_autocast = functools.partial(paddle.amp.auto_cast, enable=True, level=self.level, dtype=self.dtype)
        if precision == "fp16":
            self.scaler = paddle.amp.GradScaler(enable=True, **scaler_kwargs)

    def decorate(self, model: paddle.nn.Layer, optimizers: list[Any]) -> None:
        """Level O2: cast the model's parameters to fp16/bf16 and give the optimizers fp32 master weights."""
        if not self.enabled or self.level != "O2":
            return
        paddle.amp.decorate(models=model, optimizers=optimizers or None, level="O2", dtype=self.dtype)

    def ignored_tail(self) -> str:
        return f"{'' if self.enabled or self.dtype is None else ' on CPU'}, which has no scaler"

    def load_scaler(self, state: Mapping[str, Any]) -> None:
        missing = sorted({"scale", "incr_count", "decr_count"} - set(state))
        if missing:
            raise DriverError(f"load_precision_state: not a GradScaler state (missing {missing}).")
        self.scaler.load_state_dict(dict(state))
