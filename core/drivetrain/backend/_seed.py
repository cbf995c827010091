"""Seeding and capturing the random generators the core owns (python's and numpy's global ones).

Framework generators belong to drivers (``Driver.seed`` / ``rng_state``);
``seed_everything`` also seeds every installed framework that is already imported,
through its backend's ``DriverSpec.seed_function``, without importing any.
"""

from __future__ import annotations

import importlib
import os
import random
import sys
from typing import Any

import numpy as np

from .._common import ConfigurationError


def seed_everything(seed: int) -> int:
    """Seed python, numpy and every imported framework with a backend installed; return ``seed``.

    Call it before building the model so its initial weights repeat. A framework is seeded only if it is
    already imported (seeding never imports one), through its backend's ``seed_function``. ``PYTHONHASHSEED``
    is set for the processes started later (dataloader workers, spawned ranks).

    Example::

        import torch
        from drivetrain import seed_everything

        seed_everything(0)
        first = torch.rand(2)
        seed_everything(0)
        assert torch.equal(first, torch.rand(2))

    Args:
        seed: an int in ``[0, 2**32)``.

    Returns:
        ``seed``.

    Raises:
        ConfigurationError: for any other seed.
    """
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**32:
        raise ConfigurationError(f"seed_everything(seed={seed!r}): the seed must be an int in [0, 2**32).")
    from ._plugins import available_drivers

    random.seed(seed)
    np.random.seed(seed)
    os.environ["PYTHONHASHSEED"] = str(seed)  # for subprocesses (workers, spawned ranks)
    for spec in available_drivers().values():
        if spec.seed_function and spec.framework in sys.modules:
            module_name, _, attr = spec.seed_function.partition(":")
            getattr(importlib.import_module(module_name), attr)(seed)
    return seed


def capture_host_rng() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state()}


def restore_host_rng(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    np.random.set_state(tuple(state["numpy"]))
