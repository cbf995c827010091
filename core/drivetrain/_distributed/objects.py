"""Object collectives and ``all_reduce`` for frameworks that only move arrays (oneflow, jittor's MPI).

A driver gives its framework's array collective, and these build the rest from it:
objects travel pickled (between the processes of one run, which trust each other --
checkpoints never use pickle), first the length, then the bytes; ``all_reduce`` reduces
the gathered arrays in numpy, in rank order, so every rank gets the same result, exact
for every dtype. They serve metrics and bookkeeping: small objects, a handful of calls
per evaluation or checkpoint.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

import numpy as np

from .._common import DriverError

_REDUCE: dict[str, Callable[..., np.ndarray]] = {"sum": np.sum, "max": np.max, "min": np.min}


def broadcast_pickled(obj: Any, src: int, rank: int, broadcast: Callable[[np.ndarray, int], np.ndarray]) -> Any:
    """``obj`` of rank ``src`` on every rank (``src`` gets back its own object, not a copy).

    ``broadcast(array, src)`` returns rank ``src``'s array on every rank (the others pass
    one of the same shape and dtype to receive it).
    """
    payload = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), dtype=np.uint8) \
        if rank == src else np.zeros(0, np.uint8)
    count = int(broadcast(np.array([payload.size], dtype=np.int64), src)[0])
    data = broadcast(payload.copy() if rank == src else np.zeros(count, np.uint8), src)
    return obj if rank == src else pickle.loads(data.tobytes())  # noqa: S301 - bytes from a peer of this run


def gather_pickled(obj: Any, gather: Callable[[np.ndarray], list[np.ndarray]]) -> list[Any]:
    """Every rank's ``obj``, in rank order; ``gather(array)`` returns every rank's array of one shape and dtype."""
    payload = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), dtype=np.uint8)
    sizes = [int(size[0]) for size in gather(np.array([payload.size], dtype=np.int64))]
    padded = np.zeros(max(sizes), dtype=np.uint8)
    padded[:payload.size] = payload
    return [pickle.loads(chunk[:size].tobytes())  # noqa: S301 - bytes from a peer of this run
            for chunk, size in zip(gather(padded), sizes, strict=True)]


def reduce_gathered(parts: list[np.ndarray], op: str) -> np.ndarray:
    """``op`` (``sum``/``max``/``min``) of every rank's array, elementwise, in rank order."""
    shapes = {np.shape(part) for part in parts}
    if len(shapes) > 1:
        raise DriverError(f"all_reduce: the processes passed arrays of different shapes {sorted(shapes)}; every "
                          "process must reduce an array of the same shape.")
    return _REDUCE[op](np.stack(parts), axis=0)
