"""JittorMPIDriver: data-parallel jittor training under ``mpirun`` (OpenMPI).

jittor's data parallelism is MPI: every process runs the same script, and when jittor
is imported inside ``mpirun`` it joins the MPI world (``jt.in_mpi``, ``jt.rank``,
``jt.world_size``). What this driver adds to the single-process one:

- **Gradients.** jittor's ``optimizer.backward`` already all-reduces each gradient
  with ``mean`` over the processes (and, on its first call, broadcasts rank 0's
  parameters). The driver adds nothing on top, so gradients are averaged exactly once
  (tests/jittor check a 2-process run against one process over the same global
  batches). Every backward call communicates, also inside an accumulation cycle:
  :meth:`no_sync` cannot skip it.
- **Start.** :meth:`setup` broadcasts rank 0's parameters and buffers, so evaluation
  and checkpoints before the first step agree across processes.
- **Data.** The core's :class:`~drivetrain.backend.DistributedDriverMixin` shards the
  dataloaders; a jittor Dataset is read through drivetrain's samplers (see
  :mod:`._dataloader`): each process takes ``batch_size / N`` samples of every global
  batch, resumable mid-epoch; evaluation gives each process its own shard.
- **Collectives** for metrics and checkpoints (``broadcast_object``,
  ``all_gather_object``, ``all_reduce``) use ``MPI_Bcast`` on numpy buffers
  (:mod:`._mpi`), exact for every dtype.
- **Failures.** MPI collectives cannot time out, and a process that ends with an
  exception would block in ``MPI_Finalize`` while its peers wait in an all-reduce --
  forever. After the loop raised, this process therefore leaves with ``os._exit``
  (after Python printed the traceback), skipping ``MPI_Finalize``; mpirun sees a process
  end abnormally and stops the others, and exits non-zero. The exit code is 1, or
  128 + the signal's number when a signal stopped the run (130 for Ctrl-C, 143 for
  SIGTERM), as a shell reports a process a signal ended. Between the failure and the exit,
  the exception path's collectives (an exception checkpoint, closing the records) may
  wait for peers that are not stopping (one rank failed, or got a signal alone): each
  is bounded (:func:`_ended_after`, :data:`STOP_WAIT` seconds): the process ends when
  the others do not join, instead of waiting forever.
- **Ctrl-C.** OpenMPI's ``mpirun`` puts every process in a process group of its own, so
  a terminal's Ctrl-C reaches only ``mpirun``: it sends SIGCONT, then SIGTERM
  ``odls_base_sigkill_timeout`` seconds later (default 1), then SIGKILL as long again
  after that. The processes stop on the SIGTERM (the exception checkpoint, the records),
  so give them time: ``mpirun --mca odls_base_sigkill_timeout 5`` (docs/troubleshooting.md).
"""

from __future__ import annotations

import atexit
import contextlib
import math
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from drivetrain import TrainingTerminated
from drivetrain.backend import (
    DataSharding,
    DistributedDriverMixin,
    DriverError,
    parse_device_arg,
)

from . import _mpi
from ._dataloader import (
    describe,
    per_process_batch,
    reproducible_loader,
    shareable,
    unrepeated_loader,
)
from ._device import ACCEPTED, resolve_device
from .driver import JittorSingleDriver, jt


@dataclass(frozen=True)
class MPILayout:
    """This process's place in the MPI run and the device it uses."""

    rank: int
    world_size: int
    local_rank: int
    local_size: int
    device: Any
    even_batches: bool = False
    """Read by :class:`~drivetrain.backend.DistributedDriverMixin`; jittor has no such option (each process
    reads ``batch_size / N`` samples of every batch, N must divide it)."""


def mpi_layout(device: Any, nproc: int | None, jt: Any) -> MPILayout:
    """Read the MPI world and check ``device``/``nproc`` against it (one listed device per local process)."""
    rank, world = int(jt.rank), int(jt.world_size)
    local_rank = int(jt.mpi.local_rank())
    local_size = int(os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE", world))
    if nproc is not None and nproc != world:
        raise DriverError(
            f"nproc={nproc} but mpirun started {world} process(es); drop nproc (mpirun decides how many processes "
            f"run) or start {nproc}: mpirun -np {nproc} python your_script.py."
        )
    if isinstance(device, (list, tuple)):
        if len(device) != local_size:
            raise DriverError(
                f"device={list(device)!r} lists {len(device)} device(s) but mpirun runs {local_size} process(es) on "
                f"this machine ({world} in all); list one device per process, start mpirun -np {len(device)}, or "
                "pass device='cpu' / 'cuda' (each process takes the GPU of its local rank)."
            )
        mine = device[local_rank]
        kinds = {resolve_device(d, jt, argument=f"device[{i}]") for i, d in enumerate(device)}
        if len(kinds) > 1:
            raise DriverError(f"device={list(device)!r} mixes CPU and GPUs; list only one kind.")
        if kinds == {"cuda"}:
            listed = [parse_device_arg(d, ACCEPTED)[1] or 0 for d in device]  # each one a GPU jittor accepted
            if listed != list(range(local_size)):
                raise DriverError(
                    f"device={list(device)!r}: under MPI jittor binds process k of this machine to GPU k (its NCCL "
                    f"setup uses the local rank), so the list must be {list(range(local_size))}; choose other "
                    "GPUs with CUDA_VISIBLE_DEVICES instead."
                )
        device = mine
    return MPILayout(rank=rank, world_size=world, local_rank=local_rank, local_size=local_size, device=device)


STOP_WAIT = float(os.environ.get("DRIVETRAIN_MPI_STOP_WAIT", "30"))
"""Seconds one collective of the exception path (after the loop raised) waits for the other processes
(``DRIVETRAIN_MPI_STOP_WAIT`` sets it: an exception checkpoint of a large model needs longer)."""


@contextlib.contextmanager
def _ended_after(seconds: float) -> Iterator[None]:
    """End the process by SIGALRM unless the block finishes within ``seconds`` (main thread only).

    jittor's MPI broadcast holds the GIL while it waits, so neither a watchdog thread nor a Python
    signal handler could run: the kernel's default action for SIGALRM ends the process, and mpirun
    then stops the others ("exited on signal 14 (Alarm clock)").
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.signal(signal.SIGALRM, signal.SIG_DFL)
    signal.alarm(max(1, math.ceil(seconds)))
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, before)

_exit_notice: list[tuple[str, int]] = []
"""What this process says on its way out after a failed loop, and its exit code (the last failure's); empty
until one."""


def _exit_code(exc: BaseException | None) -> int:
    """128 + the signal's number for a run a signal stopped (as a shell reports it), else 1."""
    if isinstance(exc, TrainingTerminated):
        return int(exc.code)  # already 128 + its signal's number (it is a SystemExit)
    return 128 + signal.SIGINT if isinstance(exc, KeyboardInterrupt) else 1


def _exit_without_finalize() -> None:
    """At interpreter exit after a failed loop: flush, say why, and ``os._exit`` without MPI_Finalize."""
    words, code = _exit_notice[-1]
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.write(words)
        sys.stderr.flush()
    os._exit(code)


class JittorMPIDriver(DistributedDriverMixin, JittorSingleDriver):
    """Drives one process of an MPI data-parallel jittor run (built by ``create_driver`` under mpirun).

    Rank properties, dataloader sharding and the per-epoch check that every process has
    as many batches come from :class:`drivetrain.backend.DistributedDriverMixin`; the
    collectives are MPI broadcasts (:mod:`._mpi`). No :class:`~drivetrain.backend.
    CollectiveGuard`: an MPI collective never raises on a dead peer (mpirun stops the
    run), and there is no store for peers to post why they failed.
    """

    def __init__(self, model: Any, plan: MPILayout, **options: Any) -> None:
        super().__init__(model, plan, **options)
        self.sharding = DataSharding(
            reproducible=self._reproducible, unrepeated=_unrepeated, describe=describe, option="jittor_kwargs",
            default_loader="a jittor Dataset with set_attrs(batch_size=..., shuffle=True/False) and no sampler",
            shard_yourself="give each process a jittor Dataset of its own part of the samples",
            waits="the gradient all-reduce", same_batches="the same number of samples and batch_size everywhere",
        )
        self._failed = False

    # ------------------------------------------------------------------ lifecycle
    def setup(self) -> None:
        """Set the device (every time: it is jittor's global flag), then join the run once."""
        self._single_setup()
        super().setup()

    def _join(self) -> None:
        """Give every process rank 0's parameters and buffers."""
        for var in self.unwrap_model().state_dict().values():
            var.update(_mpi.broadcast_var(jt, var, 0))

    def _collective(self, what: str) -> contextlib.AbstractContextManager:
        """Unbounded while training (mpirun stops the run when a process dies); bounded once the loop failed."""
        return _ended_after(STOP_WAIT) if self._failed else contextlib.nullcontext()

    def on_exception(self) -> None:
        """Arrange for this process to end without MPI_Finalize (see the module docstring)."""
        self._failed = True
        exc = sys.exc_info()[1]
        what = "an exception" if exc is None else f"{type(exc).__name__}: {str(exc)[:200]}"
        if not _exit_notice:
            atexit.register(_exit_without_finalize)  # registered last, so it runs before jittor's own exit handlers
        code = _exit_code(exc)
        _exit_notice.append((
            f"drivetrain-jittor: rank {self.rank} of {self.world_size} stopped after {what}; it exits without "
            f"MPI_Finalize (code {code}) so that mpirun stops the other processes instead of leaving them waiting.\n",
            code))

    # ----------------------------------------------------------------------- data
    def set_dist_repro_dataloader(self, dataloader: Any, *, dist: str | None, reproducible: bool) -> Any:
        """The mixin's sharding, always through drivetrain's sampler: with ``dist=None`` too, since a jittor
        Dataset under MPI would split its batches over the processes by itself (each must read all of it)."""
        return super().set_dist_repro_dataloader(dataloader, dist=dist, reproducible=True)

    def _reproducible(self, dataset: Any, *, num_replicas: int, rank: int, even_batches: bool,
                      agree_seed: Callable[[int], int]) -> Any:
        """A jittor Dataset with default sampling, reading ``batch_size / num_replicas`` samples of every global batch
        (:data:`DataSharding.reproducible`); anything else as is. jittor has no ``even_batches`` option."""
        if not shareable(dataset):
            return dataset
        argument = self._argument_names().get(id(dataset), "train_dataloader")
        return reproducible_loader(dataset, num_replicas=num_replicas, rank=rank, agree_seed=agree_seed,
                                   batch_size=per_process_batch(dataset, num_replicas, argument))

    # ---------------------------------------------------------------- collectives
    def _barrier_op(self) -> None:
        jt.mpi.mpi_barrier()

    def _broadcast_array(self, array: np.ndarray, src: int) -> np.ndarray:
        return _mpi.broadcast(jt, array, src)

    def _gather_arrays(self, array: np.ndarray) -> list[np.ndarray]:
        return _mpi.gather(jt, array, self.world_size)

    def _reduce_op(self, array: np.ndarray, op: str) -> np.ndarray:
        """The core's gathered reduction (jittor's own all-reduce sums only), keeping the dtype."""
        return super()._reduce_op(np.ascontiguousarray(array), op).astype(array.dtype, copy=False)


def _unrepeated(dataset: Any, *, num_replicas: int, rank: int) -> Any:
    """This process's contiguous shard of a jittor Dataset with default sampling, or None (cannot be shared out)."""
    if not shareable(dataset):
        return None
    size = -(-int(dataset.batch_size) // num_replicas)
    return unrepeated_loader(dataset, num_replicas=num_replicas, rank=rank, batch_size=size)
