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
- **Data.** A jittor Dataset is read through drivetrain's samplers (see
  :mod:`._dataloader`): each process takes ``batch_size / N`` samples of every global
  batch, resumable mid-epoch; evaluation gives each process its own shard.
- **Collectives** for metrics and checkpoints (``broadcast_object``,
  ``all_gather_object``, ``all_reduce``) use ``MPI_Bcast`` on numpy buffers
  (:mod:`._mpi`), exact for every dtype.
- **Failures.** MPI collectives cannot time out, and a process that ends with an
  exception would block in ``MPI_Finalize`` while its peers wait in an all-reduce --
  forever. After the loop raised, this process therefore leaves with ``os._exit``
  (exit code 1, after Python printed the traceback), skipping ``MPI_Finalize``; mpirun
  sees a process end abnormally and stops the others, and exits non-zero.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from drivetrain.backend import DriverError, OverfitLoader

from . import _mpi
from ._dataloader import (
    DatasetLoader,
    describe,
    is_jittor_dataset,
    per_process_batch,
    replaceable,
    reproducible_loader,
    unrepeated_loader,
)
from ._device import resolve_device
from .driver import JittorSingleDriver, jt


@dataclass(frozen=True)
class MPILayout:
    """This process's place in the MPI run and the device it uses."""

    rank: int
    world_size: int
    local_rank: int
    local_size: int
    device: Any


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
            listed = [_index(d) for d in device]
            if listed != list(range(local_size)):
                raise DriverError(
                    f"device={list(device)!r}: under MPI jittor binds process k of this machine to GPU k (its NCCL "
                    f"setup uses the local rank), so the list must be {list(range(local_size))}; choose other "
                    "GPUs with CUDA_VISIBLE_DEVICES instead."
                )
        device = mine
    return MPILayout(rank=rank, world_size=world, local_rank=local_rank, local_size=local_size, device=device)


def _index(device: Any) -> int:
    if isinstance(device, int):
        return device
    text = str(device).strip().lower()
    return int(text.split(":")[1]) if ":" in text else 0


class _FailureExit:
    """At interpreter exit after a failed loop: flush, say why, and ``os._exit(1)`` without MPI_Finalize."""

    def __init__(self) -> None:
        self.reason: str | None = None
        self.rank = 0
        self.world = 1
        self._registered = False

    def arm(self, reason: str, rank: int, world: int) -> None:
        self.reason, self.rank, self.world = reason, rank, world
        if not self._registered:
            self._registered = True
            atexit.register(self._exit)  # registered last, so it runs before jittor's own exit handlers

    def _exit(self) -> None:
        if self.reason is None:
            return
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.write(
                f"drivetrain-jittor: rank {self.rank} of {self.world} stopped after {self.reason}; it exits without "
                "MPI_Finalize (code 1) so that mpirun stops the other processes instead of leaving them waiting.\n")
            sys.stderr.flush()
        os._exit(1)


_failure_exit = _FailureExit()


class JittorMPIDriver(JittorSingleDriver):
    """Drives one process of an MPI data-parallel jittor run (built by ``create_driver`` under mpirun)."""

    def __init__(self, model: Any, layout: MPILayout, **options: Any) -> None:
        super().__init__(model, layout.device, **options)
        self.layout = layout
        self._argument_names: dict[int, str] = {}
        self._is_setup = False

    # ------------------------------------------------------------------ lifecycle
    def is_distributed(self) -> bool:
        return True

    @property
    def rank(self) -> int:
        return self.layout.rank

    @property
    def local_rank(self) -> int:
        return self.layout.local_rank

    @property
    def world_size(self) -> int:
        return self.layout.world_size

    def setup(self) -> None:
        """Set the device, then give every process rank 0's parameters and buffers."""
        super().setup()
        if self._is_setup:
            return
        self._is_setup = True
        for var in self.unwrap_model().state_dict().values():
            var.update(_mpi.broadcast_var(jt, var, 0))

    def on_exception(self) -> None:
        """Arrange for this process to end without MPI_Finalize (see the module docstring)."""
        exc = sys.exc_info()[1]
        what = "an exception" if exc is None else f"{type(exc).__name__}: {str(exc)[:200]}"
        _failure_exit.arm(what, self.rank, self.world_size)

    def barrier(self) -> None:
        jt.mpi.mpi_barrier()

    # ----------------------------------------------------------------------- data
    def check_dataloader_legality(self, dataloader: Any, argument: str = "train_dataloader") -> None:
        self._argument_names[id(dataloader)] = argument
        super().check_dataloader_legality(dataloader, argument)

    def set_dist_repro_dataloader(self, dataloader: Any, *, dist: str | None, reproducible: bool) -> Any:
        """Share a jittor Dataset out over the processes (``dist``) and make it resumable.

        ``"train"``: each process takes ``batch_size / N`` samples of every global batch
        (one seed for all: rank 0's, broadcast). ``"eval"``: each process reads its own
        contiguous shard once. ``None``: every process reads the whole dataset (jittor
        would split it by itself under MPI). Anything that is not a jittor Dataset with
        default sampling is refused for ``"train"``/``"eval"`` with what to do instead.
        """
        if dist not in (None, "train", "eval"):
            raise DriverError(f"set_dist_repro_dataloader(dist={dist!r}): use None, 'train' or 'eval'.")
        name = self._argument_names.get(id(dataloader), "evaluate_dataloaders" if dist == "eval" else "train_dataloader")
        shareable = is_jittor_dataset(dataloader) and replaceable(dataloader)
        if dist == "eval":
            if isinstance(dataloader, OverfitLoader):
                return dataloader  # replays this process's own training batches
            if not shareable:
                self._refuse(dataloader, name, "evaluation gives each of the {w} processes its own shard",
                             "evaluate_use_dist_sampler=False")
            size = -(-int(dataloader.batch_size) // self.world_size)
            return unrepeated_loader(dataloader, num_replicas=self.world_size, rank=self.rank, batch_size=size)
        if dist == "train":
            if not shareable:
                self._refuse(dataloader, name, "data-parallel training gives each of the {w} processes its part of "
                             "every batch", "use_dist_sampler=False")
            return reproducible_loader(dataloader, num_replicas=self.world_size, rank=self.rank,
                                       batch_size=per_process_batch(dataloader, self.world_size, name),
                                       agree_seed=lambda seed: self.broadcast_object(seed, src=0))
        if shareable and not isinstance(dataloader, DatasetLoader):
            return reproducible_loader(dataloader, num_replicas=1, rank=0, batch_size=int(dataloader.batch_size),
                                       agree_seed=lambda seed: self.broadcast_object(seed, src=0))
        return dataloader

    def _refuse(self, dataloader: Any, name: str, purpose: str, opt_out: str) -> None:
        raise DriverError(
            f"{name}={type(dataloader).__name__}: {purpose.format(w=self.world_size)}, but {describe(dataloader)}. "
            "Pass a jittor Dataset with default sampling (set_attrs(batch_size=..., shuffle=True/False)), or pass "
            f"{opt_out} to the Trainer and give each process its own data; every process must then yield the "
            "same number of training batches."
        )

    def set_sampler_epoch(self, dataloader: Any, epoch: int) -> None:
        """Set the epoch, and check that every process has as many batches (else an all-reduce would wait forever)."""
        super().set_sampler_epoch(dataloader, epoch)
        try:
            count: int | None = len(dataloader)
        except TypeError:
            count = None
        counts = self.all_gather_object(count)
        if len(set(counts)) > 1:
            listed = ", ".join(f"rank {r}: {c}" for r, c in enumerate(counts))
            raise DriverError(
                f"epoch {epoch}: the processes have different numbers of training batches ({listed}); the gradient "
                "all-reduce would wait forever for the missing ones. With use_dist_sampler=False every process "
                "must yield the same number of batches, or let drivetrain share a jittor Dataset out."
            )

    # ---------------------------------------------------------------- collectives
    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        self._check_rank(src, "broadcast_object(src=...)")
        return _mpi.broadcast_object(jt, obj, src, self.rank)

    def all_gather_object(self, obj: Any) -> list[Any]:
        return _mpi.all_gather_object(jt, obj, self.rank, self.world_size)

    def all_reduce(self, array: np.ndarray, op: str = "sum") -> np.ndarray:
        """Reduce a numpy array over the processes (gathered, then reduced in numpy: exact for every dtype)."""
        super().all_reduce(array, op)
        array = np.asarray(array)
        if array.dtype.kind not in "biuf":
            raise DriverError(
                f"all_reduce: an array of dtype {array.dtype} cannot be reduced; metric elements must be numeric."
            )
        return _mpi.all_reduce(jt, array, op, self.rank, self.world_size)

    def _check_rank(self, src: Any, what: str) -> None:
        if isinstance(src, bool) or not isinstance(src, int) or not 0 <= src < self.world_size:
            raise DriverError(f"{what}: {src!r} is not a rank; ranks are 0..{self.world_size - 1}.")

    # ----------------------------------------------------------------- describing
    def describe(self) -> str:
        return (f"jittor driver (JittorMPIDriver) rank {self.rank}/{self.world_size} device={self.device} "
                f"precision={self._precision.describe()} jittor={jt.__version__}")
