"""torch's random generator states, captured and restored so a resumed run draws the same numbers.

Dropout and other in-model randomness use the global CPU generator and one
generator per CUDA device. CUDA states are read only when CUDA is already
initialised: reading them would otherwise start CUDA (slow, and it takes GPU
memory) in a run that never used the GPU, and an uninitialised device has not
drawn anything since it was seeded.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from drivetrain.backend import DriverError, check_rng_state_keys, rng_state_list, warn_device_states


def rng_state() -> dict[str, Any]:
    """``{"cpu": ByteTensor}`` plus ``"cuda": [ByteTensor per device]`` when CUDA is in use."""
    state: dict[str, Any] = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = [s.cpu() for s in torch.cuda.get_rng_state_all()]
    return state


def load_rng_state(state: Mapping[str, Any]) -> None:
    """Restore :func:`rng_state`; CUDA states are restored for the devices this machine has."""
    check_rng_state_keys(state, ("cpu", "cuda"), "torch")
    torch.set_rng_state(_byte_tensor(state["cpu"], "cpu"))
    cuda = state.get("cuda")
    if cuda is not None:
        _load_cuda_states(cuda)


def _byte_tensor(value: Any, where: str) -> torch.Tensor:
    if isinstance(value, np.ndarray):
        value = torch.from_numpy(np.ascontiguousarray(value))
    if not isinstance(value, torch.Tensor) or value.dtype != torch.uint8:
        kind = f"{type(value).__name__} of {value.dtype}" if hasattr(value, "dtype") else type(value).__name__
        raise DriverError(
            f"load_rng_state: state[{where!r}] is a {kind}; a torch RNG state is a uint8 tensor "
            "as returned by rng_state()."
        )
    return value.detach().cpu()


def _load_cuda_states(states: Any) -> None:
    states = rng_state_list(states, "cuda")
    available = warn_device_states(len(states), torch.cuda.device_count() if torch.cuda.is_available() else 0, "CUDA")
    for index, value in enumerate(states[:available]):
        torch.cuda.set_rng_state(_byte_tensor(value, f"cuda[{index}]"), index)
