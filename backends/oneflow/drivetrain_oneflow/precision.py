"""Mixed precision for the oneflow backend: the autocast to enter and the loss scaler fp16 needs.

oneflow 0.9 autocasts on CUDA only (``oneflow.autocast("cpu")`` warns and does
nothing), and its ``oneflow.amp.GradScaler`` configures ``nn.Graph`` programs only:
it has no ``scale``/``step``/``update`` for eager training. So:

- ``fp32``: nothing;
- ``bf16`` on CUDA: ``oneflow.autocast("cuda", dtype=bfloat16)``, no scaler (bf16 has fp32's range);
- ``fp16`` on CUDA: ``oneflow.autocast("cuda", dtype=float16)`` plus :class:`LossScaler`, a dynamic
  loss scaler written here (scale the loss, unscale the gradients, skip a step whose
  gradients overflowed and halve the scale, double it after ``growth_interval`` good steps);
- ``fp16``/``bf16`` on CPU: a warning, then fp32 (the capability notes say so too).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import oneflow as flow

from drivetrain.backend import AmpPrecision, DriverError, check_scaler_values, no_bf16_error, scaler_options

_DTYPES = {"fp16": flow.float16, "bf16": flow.bfloat16}
_ARGUMENT = "oneflow_kwargs['grad_scaler_kwargs']"
SCALER_KWARGS = {  # each description starts with the rule check_scaler_values applies
    "init_scale": "float > 0: first loss scale (default 65536.0)",
    "growth_factor": "float > 1: factor the scale grows by after growth_interval steps without overflow "
    "(default 2.0)",
    "backoff_factor": "float in (0, 1): factor the scale shrinks by when gradients overflow (default 0.5)",
    "growth_interval": "int >= 1: steps without overflow before the scale grows (default 2000)",
}


class LossScaler:
    """Dynamic loss scaling for eager fp16 training (oneflow 0.9 has none outside nn.Graph).

    The loss is multiplied by ``scale`` before backward, so small fp16 gradients do not
    flush to zero; before the optimizer step the gradients are divided by it again. A
    step whose gradients hold inf/NaN is skipped and the scale is multiplied by
    ``backoff_factor``; after ``growth_interval`` good steps in a row it is multiplied
    by ``growth_factor``. Device-agnostic oneflow ops only, so it is tested on the CPU.
    """

    def __init__(self, init_scale: float = 65536.0, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000) -> None:
        options = {"init_scale": init_scale, "growth_factor": growth_factor, "backoff_factor": backoff_factor,
                   "growth_interval": growth_interval}
        check_scaler_values(options, SCALER_KWARGS, _ARGUMENT)
        self.scale = float(init_scale)
        self.growth_factor = float(growth_factor)
        self.backoff_factor = float(backoff_factor)
        self.growth_interval = growth_interval
        self.growth_tracker = 0
        self._unscaled = False
        self.skipped_steps = 0

    def scale_loss(self, loss: flow.Tensor) -> flow.Tensor:
        return loss * self.scale

    def unscale(self, params: Iterable[flow.Tensor]) -> bool:
        """Divide every gradient by the scale (once per step); True when all of them are finite."""
        if self._unscaled:
            return self._finite
        grads = [p.grad for p in params if p.grad is not None]
        inverse = 1.0 / self.scale
        finite = True
        with flow.no_grad():
            for grad in grads:
                grad.mul_(inverse)
            if grads:
                total = flow.stack([g.float().abs().sum() for g in grads]).sum()
                finite = bool(flow.isfinite(total).item())
        self._unscaled, self._finite = True, finite
        return finite

    def step(self, optimizers: list[Any], params: Callable[[], Iterable[flow.Tensor]]) -> bool:
        """Unscale (if not done yet), step every optimizer unless a gradient overflowed, update the scale."""
        finite = self.unscale(params())
        if finite:
            for optimizer in optimizers:
                optimizer.step()
            self.growth_tracker += 1
            if self.growth_tracker >= self.growth_interval:
                self.scale *= self.growth_factor
                self.growth_tracker = 0
        else:
            self.scale *= self.backoff_factor
            self.growth_tracker = 0
            self.skipped_steps += 1
        self._unscaled = False
        return finite

    def state_dict(self) -> dict[str, Any]:
        return {"scale": self.scale, "growth_tracker": self.growth_tracker, "growth_factor": self.growth_factor,
                "backoff_factor": self.backoff_factor, "growth_interval": self.growth_interval}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        missing = [key for key in ("scale", "growth_tracker") if key not in state]
        if missing:
            raise DriverError(f"load_precision_state: the loss scaler state lacks {missing}.")
        self.scale = float(state["scale"])
        self.growth_tracker = int(state["growth_tracker"])
        for key in ("growth_factor", "backoff_factor"):
            if key in state:
                setattr(self, key, float(state[key]))
        if "growth_interval" in state:
            self.growth_interval = int(state["growth_interval"])


class Precision(AmpPrecision):
    """The autocast factory and optional loss scaler for one precision on one device."""

    scaler_kind = "loss scaler"
    saved_with = "fp16 on CUDA"
    fresh_scaler = "scaler"

    def __init__(self, precision: str, device: flow.device, scaler_kwargs: Mapping[str, Any] | None = None) -> None:
        super().__init__(precision)
        on_cuda = device.type == "cuda"
        options = scaler_options(scaler_kwargs, precision, _ARGUMENT, SCALER_KWARGS, check_keys=on_cuda)
        dtype = _DTYPES.get(precision)
        if dtype is None:
            return
        if not on_cuda:
            warnings.warn(
                f"precision={precision!r} on {device.type}: oneflow 0.9 has no CPU autocast, so this run trains "
                "in fp32 (the result is that of precision='fp32'). Mixed precision needs device='cuda'.",
                UserWarning,
                stacklevel=4,
            )
            return
        if precision == "bf16" and flow.cuda.get_device_capability(device)[0] < 8:
            raise no_bf16_error(device)
        self.make_autocast = functools.partial(flow.autocast, "cuda", dtype=dtype)
        if precision == "fp16":
            self.scaler = LossScaler(**options)

    @property
    def active(self) -> bool:
        """Whether the forward actually runs in reduced precision (False on CPU)."""
        return self.make_autocast is not None

    def ignored_tail(self) -> str:
        return " without one"
