"""PaddleDataParallelDriver: data-parallel training on paddle.distributed (gloo on CPU, nccl on GPUs).

One process per device. The parallel environment comes from paddle's launcher
(``python -m paddle.distributed.launch``), from processes the Trainer starts itself
(see :mod:`._launch`), or from an ``init_parallel_env()`` / ``fleet.init`` the user
already called. The model is wrapped in ``paddle.DataParallel`` (or
``fleet.distributed_model`` in fleet mode), which makes every process start from rank
0's weights. Where this driver differs from the single-process one:

- gradients are averaged over the processes once per optimizer step, just before it
  (one all-reduce per dtype and bucket: the no_sync-then-all-reduce pattern paddle's own
  trainers use for accumulation), not by DataParallel's reducer during backward. So
  accumulation costs no communication, and a peer that dies during the exchange makes
  the all-reduce raise an error here instead of aborting the process from inside
  paddle's backward (which is what the reducer does on a gloo error);
- forward and evaluation call the bare model, so evaluation may run different numbers
  of batches on different processes;
- dataloaders are re-sampled so each rank takes its share of every global batch
  (training) or its own contiguous shard (evaluation);
- a collective that fails because a peer died or stalled raises a
  :class:`DistributedError` naming that peer when it said why (see :class:`drivetrain.backend.CollectiveGuard`);
  one that cannot return is ended by the core's :class:`~drivetrain.backend.Watchdog` after the timeout.

The rank properties, dataloader sharding and naming the failed peer are the core's
(:class:`drivetrain.backend.DistributedDriverMixin`, :class:`~drivetrain.backend.CollectiveGuard`).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import paddle
import paddle.distributed as dist

from drivetrain.backend import (
    COMM_ERROR_MARKERS,
    NULL_CONTEXT,
    CheckedStore,
    CollectiveGuard,
    DataSharding,
    DistributedDriverMixin,
    DistributedError,
    DriverError,
    FailureBoard,
    Watchdog,
    reducible_array,
    settle_at_exit,
)

from ._dataloader import describe_sampling, reproducible_dataloader, unrepeated_dataloader
from ._dist_plan import DIST_KWARGS, GLOO_LIMIT, DistPlan, master_address
from ._launch import announce_ready, paddle_relaunch_command, start_children
from ._store import ThreadStore
from .driver import FRAMEWORK_KWARGS, PaddleSingleDriver

__all__ = ["DistributedError", "PaddleDataParallelDriver"]

_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
_COMM_MARKERS = (*COMM_ERROR_MARKERS, "timeout")  # paddle's gloo says TIMEOUT for a closed peer too
_ALL_FAILED_GRACE = 1.0
_BUCKET_ELEMENTS = 1 << 24  # gradients are all-reduced in flat buckets of at most this many elements
_generations = itertools.count()


class PaddleDataParallelDriver(DistributedDriverMixin, PaddleSingleDriver):
    """Drives one rank of a data-parallel paddle run (built by ``create_driver`` from a :class:`DistPlan`)."""

    accepted_kwargs: Mapping[str, str] = {**FRAMEWORK_KWARGS, **DIST_KWARGS}
    sharding = DataSharding(
        reproducible=reproducible_dataloader, unrepeated=unrepeated_dataloader, describe=describe_sampling,
        option="paddle_kwargs", default_loader="paddle.io.DataLoader(dataset, batch_size=..., shuffle=True/False)",
        shard_yourself="batch_sampler=paddle.io.DistributedBatchSampler(dataset, batch_size)",
        waits="the gradient all-reduce", same_batches="paddle.io.DistributedBatchSampler with drop_last=True",
    )

    def __init__(self, model: Any, plan: DistPlan, *, precision: str = "fp32", grad_clip: float | None = None,
                 grad_clip_type: str = "norm", model_wo_auto_param_call: bool = False,
                 framework_kwargs: Mapping[str, Any] | None = None) -> None:
        user_dp = model if isinstance(model, paddle.DataParallel) else None
        inner = model._layers if user_dp is not None else model
        super().__init__(inner, plan.device.name, precision=precision, grad_clip=grad_clip,
                         grad_clip_type=grad_clip_type, model_wo_auto_param_call=model_wo_auto_param_call,
                         framework_kwargs=framework_kwargs)
        if self.static is not None:
            raise DriverError(
                "paddle_kwargs['to_static']=True is not supported by the distributed paddle driver; train in "
                "eager mode (remove to_static) and export the trained model with "
                "drivetrain_paddle.export_inference_model."
            )
        if plan.launch == "spawn":
            self._command = paddle_relaunch_command()  # refuse a notebook / python -c before anything starts
        self.plan = plan
        self._dp: Any = user_dp
        self._store: ThreadStore | None = None
        self._watch: Watchdog | None = None
        self._guard = CollectiveGuard(plan.rank, plan.world_size, markers=_COMM_MARKERS, error_line=-1,
                                      silent_peer=self._silent_peer)
        self._collective = self._guard.collective
        self._group: Any = None  # the group gradients are averaged over (None: every process)
        self._stepping: list[Any] | None = None  # fleet's optimizer wrappers
        self._checked_grads = False
        self._is_setup = False

    # ------------------------------------------------------------------ lifecycle
    def setup(self) -> None:
        """Join (or start) the parallel environment, move the model to this rank's device, wrap it."""
        if self._is_setup:
            return
        self._is_setup = True
        plan = self.plan
        self._start_parallel_env()
        settle_at_exit()
        super().setup()  # the device, the model's placement, AMP decoration
        from paddle.distributed import fleet

        if plan.fleet:
            self._group = fleet.get_hybrid_communicate_group().get_data_parallel_group()
        if self._dp is None and any(not p.stop_gradient for p in self.model.parameters()):
            with self._collective("wrapping the model in paddle.DataParallel (it copies rank 0's weights)"):
                self._dp = fleet.distributed_model(self.model) if plan.fleet else paddle.DataParallel(self.model)
        if self._dp is not None:
            self._dp.grad_need_sync = False  # gradients are averaged in step(), never by the reducer
        if plan.fleet:
            self._stepping = [fleet.distributed_optimizer(optimizer) for optimizer in self.optimizers]
            if self.grad_scaler is not None:
                self.grad_scaler = fleet.distributed_scaler(self.grad_scaler)

    def _start_parallel_env(self) -> None:
        plan = self.plan
        if plan.launch == "spawn":
            gpus = None if plan.gpus is None else list(plan.gpus)
            launcher, self._store, own_env = start_children(
                plan.world_size, plan.timeout, plan.spawn_output, self._command, plan.backend, gpus)
            self._guard.launcher = launcher
            os.environ.update(own_env)  # init_parallel_env reads this process's place there
            try:
                launcher.wait_ready()
            except BaseException:
                launcher.note_failed()  # at exit, stop the children rather than wait for them
                raise
        elif plan.launch == "spawned":
            self._store = ThreadStore(plan.spawn_store)
            announce_ready(self._store, plan.rank)
        if plan.launch != "existing":
            os.environ["PADDLE_DISTRI_BACKEND"] = plan.backend
            if plan.backend == "nccl":
                os.environ.setdefault("PADDLE_PG_TIMEOUT", str(int(plan.timeout * 1000)))
            try:
                with self._startup_watch():
                    if plan.fleet:
                        from paddle.distributed import fleet

                        fleet.init(is_collective=True, strategy=plan.strategy)
                    else:
                        dist.init_parallel_env()
            except BaseException:
                if self._guard.launcher is not None:
                    self._guard.launcher.note_failed()
                raise
        if self._store is None:  # the board lives in the process group's own store
            self._store = ThreadStore(plan.master or master_address())
        self._store.connect_here()  # now, while every process (and the store's host) is alive
        self._guard.board = FailureBoard(CheckedStore(self._store), plan.rank, plan.world_size, next(_generations))
        limit = ("the timeout of the parallel environment you initialised" if plan.launch == "existing"
                 else f"paddle_kwargs['timeout']={plan.timeout:g} s")
        self._watch = Watchdog(plan.rank, plan.world_size, self._wait_limit(), limit=limit,
                               peer_reports=self._guard.reports_now, on_start=self._store.connect_here)
        self._watch.start()
        self._guard.watch = self._watch.watch

    @contextlib.contextmanager
    def _startup_watch(self) -> Iterator[None]:
        """The start-up gets the timeout but at least a minute (a loaded machine starts Python slowly)."""
        watch = Watchdog(self.rank, self.world_size, max(self.plan.timeout, 60.0),
                         limit="a minute (the start-up's limit)")
        try:
            with watch.watch("starting the parallel environment (init_parallel_env)"):
                yield
        finally:
            watch.stop()

    def _wait_limit(self) -> float:
        """How long a collective may wait: the timeout, and on CPU never past gloo's own 30 s."""
        if self.plan.backend == "gloo":
            return min(self.plan.timeout, GLOO_LIMIT + 5.0)  # gloo's own error comes first and names more
        return self.plan.timeout

    def on_exception(self) -> None:
        """Post why this process fails, so that peers blocked in a collective with it can name it.

        When every rank fails together (an error on all of them, Ctrl-C) collectives stay
        allowed, so that callbacks can still save a checkpoint on the way out; otherwise
        this driver refuses further collectives (a peer would never join them).
        """
        self._guard.fail(sys.exc_info()[1], grace=min(_ALL_FAILED_GRACE, self.plan.timeout),
                         broken="this process {summary} and left the other processes")

    def _silent_peer(self, waited: float) -> str:
        """What happened when a collective broke and no peer said why (for :class:`CollectiveGuard`)."""
        if self.plan.backend == "gloo" and waited < GLOO_LIMIT - 2.0:  # gloo says TIMEOUT for a closed peer too
            return f"another process ended or dropped the connection after {waited:.1f} s"
        if self.plan.backend == "gloo":
            return (f"another process did not answer within {GLOO_LIMIT:g} s (paddle's gloo gives up after that; "
                    "it cannot be raised)")
        if self.plan.launch == "existing":
            return "another process did not answer within the timeout of the parallel environment you initialised"
        return f"another process did not answer within paddle_kwargs['timeout']={self.plan.timeout:g} s"

    # --------------------------------------------------------------- optimisation
    def no_sync(self) -> contextlib.AbstractContextManager:
        """Nothing to suspend: gradients are averaged once per optimizer step, never during backward."""
        return NULL_CONTEXT

    def _optimizers_to_step(self) -> list[Any]:
        return self._stepping if self._stepping is not None else self.optimizers

    def step(self) -> None:
        if self._params:
            with self._collective("averaging the gradients (all_reduce before the optimizer step)"):
                self._average_gradients()
        super().step()

    def _average_gradients(self) -> None:
        """All-reduce the gradients in flat buckets and divide by the number of processes."""
        params = self._params
        if self.plan.find_unused_parameters:
            for param in params:
                if param.grad is None:
                    param.grad = paddle.zeros_like(param)
        else:
            params = [p for p in params if p.grad is not None]
            if not self._checked_grads:
                self._check_same_gradients(params)
        scale = 1.0 / (self.world_size if self._group is None else self._group.nranks)
        with paddle.no_grad():
            for bucket in _buckets(params):
                grads = [p.grad for p in bucket]
                flat = paddle.concat([g.reshape([-1]) for g in grads]) if len(grads) > 1 else grads[0].reshape([-1])
                dist.all_reduce(flat, group=self._group)
                flat.scale_(scale)
                offset = 0
                for grad in grads:
                    size = grad.size
                    paddle.assign(flat[offset:offset + size].reshape(grad.shape), output=grad)
                    offset += size

    def _check_same_gradients(self, params: list[Any]) -> None:
        """On the first step: every process must have gradients for the same parameters (else the
        all-reduce would mix up tensors), which holds unless ranks use different parameters."""
        self._checked_grads = True
        names = {id(p): name for name, p in self.model.named_parameters()}
        mine = [names.get(id(p), "?") for p in params]
        everyone = self.all_gather_object(mine)
        if any(other != mine for other in everyone):
            differ = sorted(set().union(*map(set, everyone)) - set.intersection(*map(set, everyone)))
            raise DriverError(
                f"the processes computed gradients for different parameters (e.g. {differ[:5]}): a parameter "
                "was not used by every process in this step. Pass paddle_kwargs={'find_unused_parameters': "
                "True} to average every parameter's gradient (a zero one where it was not used)."
            )

    # ---------------------------------------------------------------- collectives
    def barrier(self) -> None:
        with self._collective("barrier()"):
            dist.barrier()

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        box = [obj if self.rank == src else None]
        with self._collective("broadcast_object()"):
            dist.broadcast_object_list(box, src=src)
        return box[0]

    def all_gather_object(self, obj: Any) -> list[Any]:
        out: list[Any] = []
        with self._collective("all_gather_object()"):
            dist.all_gather_object(out, obj)
        return out

    def all_reduce(self, array: np.ndarray, op: str = "sum") -> np.ndarray:
        """Reduce ``array`` over the ranks (on the CPU for gloo, on this rank's GPU for nccl)."""
        super().all_reduce(array, op)
        array = reducible_array(array)
        if array.dtype == np.bool_ or array.dtype.kind == "u":
            array = array.astype(np.int64)
        tensor = paddle.to_tensor(np.ascontiguousarray(array), place=self.device.place())
        with self._collective("all_reduce()"):
            dist.all_reduce(tensor, op=_OPS[op])
        return tensor.numpy()

    # ----------------------------------------------------------------- describing
    def describe(self) -> str:
        mode = "fleet collective" if self.plan.fleet else "DataParallel"
        return (f"paddle driver (PaddleDataParallelDriver, {mode}) rank {self.rank}/{self.world_size} "
                f"device={self.device} backend={self.plan.backend} precision={self.precision} "
                f"paddle={paddle.__version__}")


def _buckets(params: list[Any]) -> Iterator[list[Any]]:
    """The parameters grouped by gradient dtype, in runs of at most ``_BUCKET_ELEMENTS`` elements."""
    by_dtype: dict[Any, list[Any]] = {}
    for param in params:
        by_dtype.setdefault(param.grad.dtype, []).append(param)
    for group in by_dtype.values():
        bucket: list[Any] = []
        size = 0
        for param in group:
            n = param.grad.size
            if bucket and size + n > _BUCKET_ELEMENTS:
                yield bucket
                bucket, size = [], 0
            bucket.append(param)
            size += n
        if bucket:
            yield bucket


