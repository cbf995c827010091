"""TorchDDPDriver: data-parallel training on torch.distributed and DistributedDataParallel.

One process per device (gloo on CPU, nccl on CUDA). The process group comes from
torchrun's environment, from processes the Trainer starts itself (see
:mod:`._launch`), or from a group the user initialised (then a model the user
already wrapped in DDP is used as is). Where this driver differs from the
single-process one:

- training calls go through DDP's forward, whatever method trains (``forward``,
  ``train_step`` or ``train_fn=``), because that is where DDP prepares the gradient
  all-reduce; evaluation calls the bare module, because DDP's forward may broadcast
  buffers, a collective that would hang when ranks evaluate different numbers of
  batches;
- dataloaders are re-sampled so each rank takes its share of every global batch
  (training) or its own contiguous shard (evaluation);
- a collective that fails because a peer died or stalled raises a
  :class:`DistributedError` naming that peer when it said why (see :class:`drivetrain.backend.FailureBoard`).
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import itertools
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from drivetrain._errors import ConfigurationError, DriverError, DrivetrainError
from drivetrain.backend import (
    READY_KEY,
    FailureBoard,
    Launcher,
    OverfitLoader,
    exception_summary,
    find_reproducible_sampler,
)

from ._dataloader import describe_sampling, reproducible_dataloader, unrepeated_dataloader
from ._dist_plan import DIST_KWARGS, DistPlan
from ._launch import start_children, torch_relaunch_command
from .driver import FRAMEWORK_KWARGS, TorchSingleDriver

_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
_COMM_MARKERS = ("gloo", "nccl", "connection reset", "connection closed", "connection refused", "timed out",
                 "broken pipe")
_ALL_FAILED_GRACE = 2.0
_generations = itertools.count()


class DistributedError(DrivetrainError, RuntimeError):
    """A collective failed because another process failed, was killed or stopped answering."""


class _Dispatch(torch.nn.Module):
    """The module DDP wraps: its forward calls the method the loop asks for.

    DDP synchronises gradients only for work done inside its own forward, so a
    ``train_step`` method must be reached through it, not called on the bare model.
    """

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, method: str, /, *args: Any, **kwargs: Any) -> Any:
        if method == "forward":
            return self.module(*args, **kwargs)  # through __call__: the model's hooks run
        return getattr(self.module, method)(*args, **kwargs)


_settled = False


def _settle_at_exit() -> None:
    """At exit, give gloo's worker threads a moment with the GIL before the interpreter finalises.

    A gloo worker drops a finished collective's tensors a little after the caller
    returns, and dropping a tensor made in Python needs the GIL; if that happens while
    the interpreter finalises, the thread is killed mid-destructor and the process
    aborts ("terminate called without an active exception", exit code -6), which a
    launcher reports as a failure. Measured: 17 of 30 two-process runs ending right after
    an all_gather aborted; with this pause, 0 of 30.
    """
    global _settled
    if not _settled:
        _settled = True
        atexit.register(time.sleep, 0.05)


def _is_comm_error(exc: BaseException) -> bool:
    if isinstance(exc, dist.DistError):
        return True
    text = str(exc).lower()
    return any(marker in text for marker in _COMM_MARKERS)


class TorchDDPDriver(TorchSingleDriver):
    """Drives one rank of a ``DistributedDataParallel`` run (built by ``create_driver`` from a :class:`DistPlan`)."""

    accepted_kwargs: Mapping[str, str] = {**FRAMEWORK_KWARGS, **DIST_KWARGS}

    def __init__(self, model: Any, plan: DistPlan, *, precision: str = "fp32", grad_clip: float | None = None,
                 grad_clip_type: str = "norm", model_wo_auto_param_call: bool = False,
                 framework_kwargs: Mapping[str, Any] | None = None) -> None:
        super().__init__(model, plan.device, precision=precision, grad_clip=grad_clip, grad_clip_type=grad_clip_type,
                         model_wo_auto_param_call=model_wo_auto_param_call, framework_kwargs=framework_kwargs)
        if plan.launch == "spawn":
            self._command = torch_relaunch_command()  # refuse a notebook / python -c before anything starts
        self.plan = plan
        self._user_ddp = isinstance(model, DistributedDataParallel)
        self._ddp: DistributedDataParallel | None = model if self._user_ddp else None
        self._launcher: Launcher | None = None
        self._store: Any = None
        self._board: FailureBoard | None = None
        self._broken: str | None = None  # why collectives are refused (after a failure)
        self._argument_names: dict[int, str] = {}
        self._is_setup = False

    # ------------------------------------------------------------------ lifecycle
    def is_distributed(self) -> bool:
        return True

    @property
    def rank(self) -> int:
        return self.plan.rank

    @property
    def local_rank(self) -> int:
        return self.plan.local_rank

    @property
    def world_size(self) -> int:
        return self.plan.world_size

    def setup(self) -> None:
        """Join (or start) the process group, move the model to this rank's device, wrap it in DDP."""
        if self._is_setup:
            return
        self._is_setup = True
        plan = self.plan
        if plan.device.type == "cuda":
            torch.cuda.set_device(plan.device)
        self._start_process_group()
        _settle_at_exit()
        self._store = dist.distributed_c10d._get_default_store()  # held: rank 0's store outlives a shutdown
        self._board = FailureBoard(self._store, plan.rank, plan.world_size, next(_generations))
        module = self._bare_module()
        if self._user_ddp:
            return
        module.to(self.device)
        if any(p.requires_grad for p in module.parameters()):
            device_ids = [self.device.index] if self.device.type == "cuda" else None
            with self._collective("wrapping the model in DistributedDataParallel (it copies rank 0's weights)"):
                self._ddp = DistributedDataParallel(_Dispatch(module), device_ids=device_ids, **plan.ddp_kwargs)

    def _start_process_group(self) -> None:
        plan = self.plan
        if plan.launch == "existing":
            return
        timeout = datetime.timedelta(seconds=plan.timeout)
        options: dict[str, Any] = {"backend": plan.backend, "timeout": timeout, "rank": plan.rank,
                                   "world_size": plan.world_size}
        if plan.backend == "nccl":
            options["device_id"] = plan.device  # binds the communicator to this GPU at once
        what = "starting the process group"
        if plan.launch == "env":
            with self._collective(f"{what} (torchrun's MASTER_ADDR/MASTER_PORT)"):
                dist.init_process_group(init_method="env://", **options)
            return
        if plan.launch == "spawned":
            addr, port = plan.master
            with self._collective(what):
                store = dist.TCPStore(addr, port, plan.world_size, is_master=False, timeout=timeout)
                store.set(READY_KEY.format(rank=plan.rank), "1")
                dist.init_process_group(store=dist.PrefixStore("default_pg", store), **options)
            return
        try:
            self._launcher, store = start_children(plan.world_size, plan.timeout, plan.spawn_output, self._command)
            self._launcher.wait_ready()
            with self._collective(what):
                # the prefix env:// gives its store, so this group and the children's meet in one namespace
                dist.init_process_group(store=dist.PrefixStore("default_pg", store), **options)
        except BaseException:
            if self._launcher is not None:
                self._launcher.note_failed()  # at exit, stop the children rather than wait for them
            raise

    def on_exception(self) -> None:
        """Post why this process fails, then shut the process group unless every rank is failing too.

        Peers blocked in a collective with this process learn the cause from the board
        when their collective breaks (at the latest after ``timeout``). When every rank
        fails together (an error on all of them, Ctrl-C) the group stays up so that
        callbacks can still save a checkpoint on the way out.
        """
        exc = sys.exc_info()[1]
        if self._launcher is not None:
            self._launcher.note_failed()
        if self._broken is not None or self._board is None:
            return
        keep = False
        if not isinstance(exc, DistributedError):
            self._board.post_failure(exception_summary(exc))
            keep = self._board.all_failed(min(_ALL_FAILED_GRACE, self.plan.timeout))
        if keep:
            return
        self._broken = f"the process group was shut down after this process {exception_summary(exc)}"
        if self.plan.launch == "existing":
            return  # the user's group: theirs to destroy
        with contextlib.suppress(Exception):
            abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
            if self.plan.backend == "nccl" and abort is not None:
                abort()  # an NCCL communicator stuck on a dead peer would block destroy
            else:
                dist.destroy_process_group()

    # ------------------------------------------------------------ failure naming
    @contextlib.contextmanager
    def _collective(self, what: str) -> Iterator[None]:
        if self._broken is not None:
            raise DistributedError(f"{what} on rank {self.rank} is not possible: {self._broken}.")
        try:
            yield
        except RuntimeError as exc:
            self._raise_peer_failure(exc, what)
            raise

    def _raise_peer_failure(self, exc: RuntimeError, what: str) -> None:
        """Raise a DistributedError for a failed collective (naming the peer that caused it if known)."""
        if isinstance(exc, DrivetrainError) or not _is_comm_error(exc):
            return
        reports = self._reports(wait=1.0)
        detail = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        if reports:
            cause = "; ".join(f"rank {r} {text}" for r, text in sorted(reports.items()))
            raise DistributedError(
                f"{what} failed on rank {self.rank} of {self.world_size} because {cause}. This process stops too; "
                f"the cause is in that rank's own output. ({detail})"
            ) from exc
        limit = ("the timeout given to init_process_group" if self.plan.launch == "existing"
                 else f"torch_kwargs['timeout']={self.plan.timeout:g} s")
        raise DistributedError(
            f"{what} failed on rank {self.rank} of {self.world_size}: another process ended or did not answer "
            f"within {limit} without saying why (killed? out of memory? stuck?). Look at the other processes' "
            f"output. ({detail})"
        ) from exc

    def _reports(self, wait: float) -> dict[int, str]:
        """What the other ranks (or, in the parent of spawned ranks, their exit codes) say, waiting up to ``wait`` s."""
        deadline = time.monotonic() + wait
        while True:
            reports = self._launcher.failures() if self._launcher is not None else {}
            if self._board is not None:
                for rank, text in self._board.reports().items():
                    known = reports.get(rank)
                    reports[rank] = text if known is None or known in text else f"{text}; {known}"
            if reports or time.monotonic() >= deadline:
                return reports
            time.sleep(0.1)

    # ---------------------------------------------------------------------- model
    def _bare_module(self) -> torch.nn.Module:
        """The model below DDP (possibly ``torch.compile``-d): what evaluation calls."""
        return self.model.module if self._user_ddp else self.model

    def unwrap_model(self) -> torch.nn.Module:
        model = self._bare_module()
        while isinstance(getattr(model, "_orig_mod", None), torch.nn.Module):
            model = model._orig_mod
        return model

    def _wrapped_model_call(self) -> Any:
        return self._bare_module()

    def get_model_call_fn(self, fn_name: str | None, default: str = "train_step") -> tuple[Callable, Callable]:
        """Training (``default='train_step'``) goes through DDP; evaluation calls the bare module."""
        fn, signature = super().get_model_call_fn(fn_name, default)
        if default != "train_step" or self._ddp is None:
            return fn, signature
        module = self.unwrap_model()
        if fn_name is None:
            fn_name = default if callable(getattr(module, default, None)) else self.default_forward_name
        return self._through_ddp(fn_name), signature

    def _through_ddp(self, method: str) -> Callable:
        ddp, dispatching = self._ddp, not self._user_ddp

        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                if dispatching:
                    return ddp(method, *args, **kwargs)
                if method == "forward":
                    return ddp(*args, **kwargs)
                return _call_through_user_ddp(ddp, method, args, kwargs)
            except RuntimeError as exc:
                self._raise_peer_failure(exc, f"the training forward ({method}) through DDP")
                raise

        return call

    def set_model_mode(self, mode: str) -> None:
        if self._ddp is None or mode not in ("train", "eval"):
            super().set_model_mode(mode)
        else:
            self._ddp.train(mode == "train")

    def no_sync(self) -> contextlib.AbstractContextManager:
        return self._ddp.no_sync() if self._ddp is not None else contextlib.nullcontext()

    def backward(self, loss: Any) -> None:
        try:
            super().backward(loss)
        except RuntimeError as exc:
            self._raise_peer_failure(exc, "backward (the gradient all-reduce)")
            raise

    # ----------------------------------------------------------------------- data
    def check_dataloader_legality(self, dataloader: Any, argument: str = "train_dataloader") -> None:
        self._argument_names[id(dataloader)] = argument  # named again if its sampling cannot be replaced
        super().check_dataloader_legality(dataloader, argument)

    def set_dist_repro_dataloader(self, dataloader: Any, *, dist: str | None, reproducible: bool) -> Any:
        """Shard ``dataloader`` over the ranks (``dist``) and make it resumable (``reproducible``).

        ``"train"``: a :class:`~drivetrain.ReproducibleBatchSampler` gives each rank its part
        of every global batch, with one seed for all ranks (rank 0's, broadcast).
        ``"eval"``: each rank reads a contiguous shard, every sample once. A dataloader
        whose sampling cannot be replaced is refused with what to do instead.
        """
        if dist not in (None, "train", "eval"):
            raise DriverError(f"set_dist_repro_dataloader(dist={dist!r}): use None, 'train' or 'eval'.")
        if dist == "eval":
            if isinstance(dataloader, OverfitLoader):
                return dataloader  # replays this rank's own training batches
            shard = unrepeated_dataloader(dataloader, num_replicas=self.world_size, rank=self.rank)
            if shard is None:
                self._refuse(dataloader, "evaluate_dataloaders", "evaluation gives each of the {w} processes its "
                             "own shard of the data", "evaluate_use_dist_sampler=False")
            return shard
        if dist is None and not reproducible:
            return dataloader
        train = dist == "train"
        try:
            loader = reproducible_dataloader(
                dataloader, num_replicas=self.world_size if train else 1, rank=self.rank if train else 0,
                even_batches=self.plan.even_batches and train,
                agree_seed=lambda seed: self.broadcast_object(seed, src=0))
        except ConfigurationError as exc:
            raise DriverError(f"torch_kwargs['even_batches']=True: {exc}") from None
        if train and find_reproducible_sampler(loader) is None:
            self._refuse(dataloader, "train_dataloader", "distributed training gives each of the {w} processes "
                         "its share of every batch by replacing the dataloader's sampling", "use_dist_sampler=False")
        return loader

    def _refuse(self, dataloader: Any, default_name: str, purpose: str, opt_out: str) -> None:
        name = self._argument_names.get(id(dataloader), default_name)
        raise DriverError(
            f"{name}={type(dataloader).__name__}: {purpose.format(w=self.world_size)}, but {describe_sampling(dataloader)}. "
            "Either build it with default sampling, torch.utils.data.DataLoader(dataset, batch_size=..., "
            f"shuffle=True/False), or pass {opt_out} to the Trainer and shard the data yourself (e.g. "
            "sampler=DistributedSampler(dataset)); every process must then yield the same number of training batches."
        )

    def set_sampler_epoch(self, dataloader: Any, epoch: int) -> None:
        """Set the epoch, and check that every rank has as many batches (else DDP would wait forever)."""
        super().set_sampler_epoch(dataloader, epoch)
        try:
            count: int | None = len(dataloader)
        except TypeError:
            count = None
        counts = self.all_gather_object(count)
        if len(set(counts)) > 1:
            listed = ", ".join(f"rank {r}: {c}" for r, c in enumerate(counts))
            raise DriverError(
                f"epoch {epoch}: the processes have different numbers of training batches ({listed}); DDP would "
                "wait forever for the missing ones. With use_dist_sampler=False each process's dataloader must "
                "yield the same number of batches (e.g. DistributedSampler(dataset, drop_last=True) and the same "
                "batch_size everywhere), or let drivetrain split the data (use_dist_sampler=True)."
            )

    # ---------------------------------------------------------------- collectives
    def barrier(self) -> None:
        with self._collective("barrier()"):
            if self.plan.backend == "nccl":
                dist.barrier(device_ids=[self.device.index])
            else:
                dist.barrier()

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        box = [obj if self.rank == src else None]
        with self._collective("broadcast_object()"):
            dist.broadcast_object_list(box, src=src)
        return box[0]

    def all_gather_object(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.world_size
        with self._collective("all_gather_object()"):
            dist.all_gather_object(out, obj)
        return out

    def all_reduce(self, array: np.ndarray, op: str = "sum") -> np.ndarray:
        """Reduce ``array`` over the ranks (on this rank's device for nccl, on the CPU for gloo)."""
        super().all_reduce(array, op)
        array = np.asarray(array)
        if array.dtype.kind not in "biuf":
            raise DriverError(
                f"all_reduce: an array of dtype {array.dtype} cannot be reduced; metric elements must be numeric."
            )
        if array.dtype == np.bool_ or array.dtype.kind == "u" and array.dtype != np.uint8:
            array = array.astype(np.int64)
        tensor = torch.from_numpy(np.array(array, copy=True, order="C"))
        if self.plan.backend == "nccl":
            tensor = tensor.to(self.device)
        with self._collective("all_reduce()"):
            dist.all_reduce(tensor, op=_OPS[op])
        return tensor.cpu().numpy()

    # ----------------------------------------------------------------- describing
    def describe(self) -> str:
        return (f"torch driver (TorchDDPDriver) rank {self.rank}/{self.world_size} device={self.device} "
                f"backend={self.plan.backend} precision={self.precision} torch={torch.__version__}")


def _call_through_user_ddp(ddp: DistributedDataParallel, method: str, args: tuple, kwargs: dict) -> Any:
    """Run ``module.<method>`` inside the user's DDP forward, so its gradients are synchronised.

    The module's ``forward`` is replaced for exactly one call (put back before the method
    runs, so a method calling ``self(...)`` reaches the real forward).
    """
    module = ddp.module
    target = getattr(module, method)
    missing = object()
    saved = module.__dict__.get("forward", missing)

    def restore() -> None:
        if saved is missing:
            module.__dict__.pop("forward", None)
        else:
            module.__dict__["forward"] = saved

    def once(*a: Any, **k: Any) -> Any:
        restore()
        return target(*a, **k)

    module.__dict__["forward"] = once
    try:
        return ddp(*args, **kwargs)
    finally:
        restore()
