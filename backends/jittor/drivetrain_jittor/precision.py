"""Mixed precision for the jittor backend: jittor's global AMP level, opt-in and scoped to the forward.

jittor has no autocast per model or per thread. Its only mixed-precision switch is
the process-wide flag ``jt.flags.auto_mixed_precision_level`` (0 = off; 4 = prefer
float16, keep reductions such as sum and exp in float32; 5 = also create arrays in
float16; 6 = float16 everywhere it can), read when an operation is created. While it
is set, matrix products and convolutions of float32 inputs produce float16 -- in
*any* jittor code of the process, not only the model's.

So ``precision="fp16"`` is never silent: it needs ``jittor_kwargs={"amp_level": N}``
with N in 4..6, which says the user accepts a global flag. The driver then sets the
level around the training forward only (``jt.flag_scope``) and restores the previous
value after it; the backward follows the recorded operations. There is no loss scaler
and no float32 master copy of the parameters (jittor has neither), so small gradients
can underflow. On a CPU float16 is emulated and slow: the driver warns.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any

from drivetrain.backend import DriverError

AMP_LEVELS = (4, 5, 6)
AMP_OPTION = "amp_level"


class Precision:
    """The forward context for one precision: a shared no-op for fp32, jittor's AMP flag scope for fp16."""

    def __init__(self, precision: str, device: str, amp_level: Any, jt: Any) -> None:
        self.precision = precision
        self.level: int | None = None
        self._jt = jt
        self._null = contextlib.nullcontext()
        if precision == "fp32":
            if amp_level is not None:
                raise DriverError(
                    f"jittor_kwargs['{AMP_OPTION}']={amp_level!r} sets jittor's mixed-precision level, but "
                    "precision='fp32'; pass precision='fp16' (fp16=True) with it, or remove it."
                )
            return
        if precision != "fp16":
            raise DriverError(f"precision={precision!r} is not supported by the jittor driver; use 'fp32' or 'fp16'.")
        if amp_level is None:
            raise DriverError(
                "precision='fp16': jittor has no per-model autocast; its only mixed precision is the process-wide "
                "flag jt.flags.auto_mixed_precision_level, which turns float32 matrix products and convolutions of "
                "ANY jittor code into float16 while it is set (no loss scaling, no float32 master weights). To "
                f"accept that, pass jittor_kwargs={{'{AMP_OPTION}': 4}} (4: reductions stay float32; 5: arrays "
                "are created in float16 too; 6: float16 wherever possible); the driver sets it around the "
                "training forward only. Or train with precision='fp32'."
            )
        if isinstance(amp_level, bool) or amp_level not in AMP_LEVELS:
            raise DriverError(
                f"jittor_kwargs['{AMP_OPTION}']={amp_level!r} is not accepted; pass 4, 5 or 6 "
                "(jt.flags.auto_mixed_precision_level; 0-3 do not use float16)."
            )
        self.level = int(amp_level)
        if device == "cpu":
            warnings.warn(
                f"precision='fp16' on CPU: jittor emulates float16 on the CPU, which is slower than float32 and "
                f"less accurate; the run uses auto_mixed_precision_level={self.level} anyway. Use a GPU for "
                "mixed precision, or precision='fp32'.",
                UserWarning,
                stacklevel=4,
            )

    def autocast(self) -> contextlib.AbstractContextManager:
        """The AMP level around the forward (and back to the previous level after it), or a no-op."""
        if self.level is None:
            return self._null
        return self._jt.flag_scope(auto_mixed_precision_level=self.level)

    def state(self) -> None:
        """Nothing to save: jittor's AMP has no loss scaler."""
        return None

    def load_state(self, state: Any) -> None:
        """Nothing to restore (see :meth:`state`)."""

    def describe(self) -> str:
        return self.precision if self.level is None else f"fp16 (global auto_mixed_precision_level={self.level})"
