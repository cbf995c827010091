"""Array broadcasts over MPI for the jittor MPI driver.

jittor exposes ``jt.mpi.broadcast(array, root)``, an ``MPI_Bcast`` of a numpy array's
bytes in place; the driver's collectives are built from it. Objects travel pickled
(the core's :func:`drivetrain.backend.broadcast_pickled` / ``gather_pickled``), and
``all_reduce`` gathers the arrays and reduces them in numpy, which is exact for every
dtype (jittor's own all-reduce supports only sums, and of int64 not correctly). These
serve metrics and bookkeeping: small objects, a handful of calls per evaluation or checkpoint.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def broadcast(jt: Any, array: np.ndarray, src: int) -> np.ndarray:
    """Rank ``src``'s ``array`` on every rank (the others pass one of the same shape and dtype), in a new buffer."""
    buffer = np.ascontiguousarray(array).copy()
    jt.mpi.broadcast(buffer, src)
    return buffer


def gather(jt: Any, array: np.ndarray, world: int) -> list[np.ndarray]:
    """Every rank's ``array`` (the same shape and dtype everywhere), in rank order: one broadcast per rank."""
    return [broadcast(jt, array, r) for r in range(world)]


def broadcast_var(jt: Any, var: Any, src: int) -> Any:
    """Rank ``src``'s values of ``var`` as a new Var of the same dtype (bytes broadcast: any dtype, bf16 too)."""
    dtype = str(var.dtype)
    array = np.ascontiguousarray(var.float32().numpy() if dtype == "bfloat16" else var.numpy())
    jt.mpi.broadcast(array, src)
    return jt.array(array).bfloat16() if dtype == "bfloat16" else jt.array(array, dtype=dtype)
