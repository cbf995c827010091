"""The jittor backend's kit for drivetrain's conformance checks (``drivetrain.testing``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from drivetrain.testing import BackendKit, linear_classifier

from ._import import import_jittor

jt = import_jittor()


def _to_var(array: np.ndarray) -> Any:
    return jt.array(array, dtype=str(array.dtype))  # jt.array alone turns int64 into int32


class _Arrays(jt.dataset.Dataset):  # type: ignore[misc]  # jittor's dataset class
    """``(x, target)`` arrays as a jittor Dataset of ``{"x", "target"}`` batches of ``batch_size``."""

    def __init__(self, x: np.ndarray, target: np.ndarray, batch_size: int) -> None:
        super().__init__()
        self.x, self.target = x, target
        self.set_attrs(batch_size=batch_size, total_len=len(x), shuffle=False)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {"x": self.x[index], "target": self.target[index]}


def jittor_kit() -> BackendKit:
    return BackendKit(
        driver="jittor",
        make_model=linear_classifier(jt.Module, jt.nn.Linear, jt.nn.cross_entropy_loss,
                                     lambda param, array: param.update(jt.array(array)), forward="execute"),
        make_optimizer=lambda model, lr: jt.optim.SGD(model.parameters(), lr=lr),
        to_tensor=_to_var,
        random=lambda: float(jt.random((1,)).numpy()[0]),
        make_loader=_Arrays,
    )
