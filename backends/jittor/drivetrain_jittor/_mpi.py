"""Object and array collectives over MPI for the jittor MPI driver.

jittor exposes ``jt.mpi.broadcast(array, root)``, an ``MPI_Bcast`` of a numpy array's
bytes in place; everything here is built from it. Objects travel pickled (between the
processes of one run, which trust each other -- checkpoints never use pickle): first
the length, then the bytes. ``all_gather`` is one broadcast per rank, and ``all_reduce``
gathers the arrays and reduces them in numpy, which is exact for every dtype (jittor's
own all-reduce supports only sums, and of int64 not correctly). These serve metrics and
bookkeeping: small objects, a handful of calls per evaluation or checkpoint.
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np

from drivetrain.backend import DriverError

_REDUCE = {"sum": np.sum, "max": np.max, "min": np.min}


def _broadcast_bytes(jt: Any, payload: bytes | None, src: int, rank: int) -> bytes:
    size = np.array([len(payload) if rank == src else 0], dtype=np.int64)
    jt.mpi.broadcast(size, src)
    buffer = np.frombuffer(payload, dtype=np.uint8).copy() if rank == src else np.empty(int(size[0]), np.uint8)
    if buffer.size:
        jt.mpi.broadcast(buffer, src)
    return buffer.tobytes()


def broadcast_object(jt: Any, obj: Any, src: int, rank: int) -> Any:
    """``obj`` of rank ``src`` on every rank (``src`` gets back its own object, not a copy)."""
    payload = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL) if rank == src else None
    data = _broadcast_bytes(jt, payload, src, rank)
    return obj if rank == src else pickle.loads(data)  # noqa: S301 - bytes from a peer process of this run


def broadcast_var(jt: Any, var: Any, src: int) -> Any:
    """Rank ``src``'s values of ``var`` as a new Var of the same dtype (bytes broadcast: any dtype, bf16 too)."""
    dtype = str(var.dtype)
    array = np.ascontiguousarray(var.float32().numpy() if dtype == "bfloat16" else var.numpy())
    jt.mpi.broadcast(array, src)
    return jt.array(array).bfloat16() if dtype == "bfloat16" else jt.array(array, dtype=dtype)


def all_gather_object(jt: Any, obj: Any, rank: int, world: int) -> list[Any]:
    """Every rank's ``obj``, in rank order."""
    return [broadcast_object(jt, obj if r == rank else None, r, rank) for r in range(world)]


def all_reduce(jt: Any, array: np.ndarray, op: str, rank: int, world: int) -> np.ndarray:
    """``op`` (``sum``/``max``/``min``) of every rank's ``array``, elementwise; the dtype is kept."""
    parts = all_gather_object(jt, np.ascontiguousarray(array), rank, world)
    shapes = {part.shape for part in parts}
    if len(shapes) > 1:
        raise DriverError(f"all_reduce: the processes passed arrays of different shapes {sorted(shapes)}; every "
                          "process must reduce an array of the same shape.")
    return _REDUCE[op](np.stack(parts), axis=0).astype(array.dtype, copy=False)
