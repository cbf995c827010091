"""paddle's random generator states, captured and restored so a resumed run draws the same numbers.

Dropout and the random ops use paddle's generators: one for the CPU and one per GPU.
A ``GeneratorState`` exposes no public accessor beyond its seed, but it supports
pickling through ``__getstate__``/``__setstate__`` with plain values
``(device, seed, offset, engine)`` where ``engine`` is the Mersenne Twister's state as
text (a list of character codes). Those values are stored -- the engine as a uint8
tensor, the rest as numbers -- and a state is rebuilt from them with
``__setstate__``; nothing is pickled.

numpy's and python's global generators (paddle's own DataLoader shuffles with
numpy's) are the core's to capture.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import paddle

from drivetrain.backend import DriverError, check_rng_state_keys, rng_state_list, warn_device_states

_State = paddle.base.libpaddle.GeneratorState


def _encode(state: Any) -> dict[str, Any]:
    device, seed, offset, engine = state.__getstate__()
    return {"device": int(device), "seed": int(seed), "offset": int(offset),
            "engine": paddle.to_tensor(np.asarray(engine, dtype=np.uint8), place=paddle.CPUPlace())}


def _decode(value: Any, where: str) -> Any:
    if not isinstance(value, Mapping) or not {"device", "seed", "offset", "engine"} <= set(value):
        raise DriverError(f"load_rng_state: {where} is not a paddle generator state (a dict with device, seed, "
                          "offset and engine, as rng_state() returns).")
    engine = value["engine"]
    engine = np.asarray(engine.numpy() if isinstance(engine, paddle.Tensor) else engine)
    if engine.dtype != np.uint8 or engine.ndim != 1:
        raise DriverError(f"load_rng_state: {where}['engine'] must be a 1-d uint8 array, got {engine.dtype}.")
    state = _State.__new__(_State)
    try:
        state.__setstate__((int(value["device"]), int(value["seed"]), int(value["offset"]), engine.tolist()))
    except (TypeError, ValueError, RuntimeError) as exc:
        raise DriverError(f"load_rng_state: {where} could not be restored ({exc}).") from exc
    return state


def rng_state(include_gpu: bool) -> dict[str, Any]:
    """``{"cpu": [state], "gpu": [state per GPU]}``; ``"gpu"`` only when the driver runs on a GPU
    (reading the GPU generators of a CPU run would only set up GPU contexts it never uses)."""
    state: dict[str, Any] = {"cpu": [_encode(s) for s in paddle.get_rng_state("cpu")]}
    if include_gpu:
        state["gpu"] = [_encode(s) for s in paddle.get_cuda_rng_state()]
    return state


def load_rng_state(state: Mapping[str, Any]) -> None:
    """Restore :func:`rng_state`; GPU states are restored for the GPUs this machine has."""
    check_rng_state_keys(state, ("cpu", "gpu"), "paddle")
    cpu = _decode_all(state, "cpu")
    gpu = None if state.get("gpu") is None else _decode_all(state, "gpu")
    paddle.set_rng_state(cpu, "cpu")
    if gpu is not None:
        _load_gpu_states(gpu)


def _decode_all(state: Mapping[str, Any], key: str) -> list[Any]:
    states = rng_state_list(state[key], key, "a list of states")
    return [_decode(value, f"state[{key!r}][{index}]") for index, value in enumerate(states)]


def _load_gpu_states(states: list[Any]) -> None:
    available = paddle.device.cuda.device_count() if paddle.is_compiled_with_cuda() else 0
    restored = warn_device_states(len(states), available, "GPU")
    if available:
        current = paddle.get_cuda_rng_state()
        current[:restored] = states[:available]
        paddle.set_cuda_rng_state(current)
