"""PaddleDataParallelDriver: data-parallel training on paddle.distributed (gloo on CPU, nccl on GPUs).

One process per device. The parallel environment comes from paddle's launcher
(``python -m paddle.distributed.launch``), from processes the Trainer starts itself
(see :mod:`._launch`), or from an ``init_parallel_env()`` / ``fleet.init`` the user
already called. The model is wrapped in ``paddle.DataParallel`` (or
``fleet.distributed_model`` in fleet mode), which makes every process start from rank
0's weights. Where this driver differs from the single-process one:

- ``paddle_kwargs['overlap']`` (default: on with nccl, off with gloo) says when gradients are
  averaged. On: by DataParallel's reducer, bucket by bucket while backward still runs
  (training calls arm it as DataParallel.forward would; DataParallel.no_sync() while
  accumulating). Off: once per optimizer step, just before it (one all-reduce per dtype and
  bucket, the no_sync-then-all-reduce pattern of paddle's own trainers), so accumulation
  costs no communication and a peer that dies during the exchange makes the all-reduce
  raise here. On gloo the reducer instead aborts this process from inside paddle's backward
  (SIGABRT: paddle cannot turn gloo's exception into a Python one): a peer that raised or
  stalled is still named (the watchdog reads its report, or times out, first), a killed one
  is not, hence off with gloo (where the reducer gains no wall time: gloo blocks backward);
- training calls go through the reducer only with overlap; evaluation always calls the bare
  model, so evaluation may run different numbers of batches on different processes;
- dataloaders are re-sampled so each rank takes its share of every global batch
  (training) or its own contiguous shard (evaluation);
- a collective that fails because a peer died or stalled raises a
  :class:`DistributedError` naming that peer when it said why (see :class:`drivetrain.backend.CollectiveGuard`);
  one that cannot return is ended by the core's :class:`~drivetrain.backend.Watchdog` after the timeout.

What is not paddle's own -- rank properties, dataloader sharding, the shape of the collectives,
naming the failed peer -- is the core's (:class:`drivetrain.backend.DistributedDriverMixin`,
:class:`~drivetrain.backend.CollectiveGuard`).
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import paddle
import paddle.distributed as dist

from drivetrain.backend import (
    COMM_ERROR_MARKERS,
    NULL_CONTEXT,
    READY_KEY,
    CollectiveGuard,
    DataSharding,
    DistributedDriverMixin,
    DistributedError,
    DriverError,
    FailureBoard,
    FolderStore,
    ThreadStore,
    Watchdog,
    end_process,
    flat_buckets,
    settle_at_exit,
    startup_patience,
)

from ._dataloader import describe_sampling, reproducible_dataloader, unrepeated_dataloader
from ._dist_plan import DIST_KWARGS, GLOO_LIMIT, DistPlan, master_address
from ._launch import paddle_relaunch_command, paddle_store, start_children
from ._sharding import GroupSharding
from .driver import FRAMEWORK_KWARGS, PaddleSingleDriver

__all__ = ["DistributedError", "PaddleDataParallelDriver"]

_COMM_MARKERS = (*COMM_ERROR_MARKERS, "timeout")  # paddle's gloo says TIMEOUT for a closed peer too
_THEIRS = "the timeout of the parallel environment you initialised"
_IN_BACKWARD = "backward (the gradient all-reduce in paddle.DataParallel's reducer)"
# Where gloo's reducer may abort this process: say why at once, then give the failed peer (it exits within ~1 s of
# its report: FailureBoard.all_failed's grace) time to print its traceback and exit, which aborts this process.
_END_AFTER_GRACE = functools.partial(end_process, linger=3.0)


class PaddleDataParallelDriver(DistributedDriverMixin, PaddleSingleDriver):
    """Drives one rank of a data-parallel paddle run (built by ``create_driver`` from a :class:`DistPlan`)."""

    accepted_kwargs: Mapping[str, str] = {**FRAMEWORK_KWARGS, **DIST_KWARGS}
    _all_failed_grace = 1.0
    _refusal = "this process {summary} and left the other processes"
    sharding = DataSharding(
        reproducible=reproducible_dataloader, unrepeated=unrepeated_dataloader, describe=describe_sampling,
        option="paddle_kwargs", default_loader="paddle.io.DataLoader(dataset, batch_size=..., shuffle=True/False)",
        shard_yourself="batch_sampler=paddle.io.DistributedBatchSampler(dataset, batch_size)",
        waits="the gradient all-reduce", same_batches="paddle.io.DistributedBatchSampler with drop_last=True",
    )

    def __init__(self, model: Any, plan: DistPlan, **options: Any) -> None:
        user_dp = model if isinstance(model, paddle.DataParallel) else None
        super().__init__(model._layers if user_dp is not None else model, plan, **options)
        if self.static is not None:
            raise DriverError(
                "paddle_kwargs['to_static']=True is not supported by the distributed paddle driver; train in "
                "eager mode (remove to_static) and export the trained model with "
                "drivetrain_paddle.export_inference_model."
            )
        if plan.launch == "spawn":
            self._command = paddle_relaunch_command()  # refuse a notebook / python -c before anything starts
        self._dp: Any = user_dp
        self._store: ThreadStore | FolderStore | None = None
        self._guard = CollectiveGuard(plan.rank, plan.world_size, markers=_COMM_MARKERS, error_line=-1,
                                      silent_peer=self._silent_peer)
        self._group: Any = None  # the group gradients are averaged over (None: every process)
        self._unchecked = plan.overlap and not plan.find_unused_parameters  # see step()
        self._sharding: GroupSharding | None = None  # paddle_kwargs['sharding'] (see _sharding.py)
        self._gathered_optimizer: list[Any] | None = None
        if plan.sharding and self.grad_clip is not None:
            raise DriverError(
                f"grad_clip={self.grad_clip} with paddle_kwargs['sharding']={plan.sharding!r}: each process holds a share "
                "of the gradients, so clip in the optimizer, whose clip group sharding makes global: "
                "grad_clip=paddle.nn.ClipGradByGlobalNorm(clip_norm) in the optimizer's constructor, and no Trainer "
                "grad_clip."
            )

    # ------------------------------------------------------------------ lifecycle
    def _join(self) -> None:
        """Join (or start) the parallel environment, move the model to this rank's device, wrap it."""
        plan = self.plan
        self._start_parallel_env()
        settle_at_exit()
        self._single_setup()  # the device, the model's placement, AMP decoration
        from paddle.distributed import fleet

        if plan.fleet:
            self._group = fleet.get_hybrid_communicate_group().get_data_parallel_group()
        if plan.sharding:
            with self._collective(f"wrapping the model with group_sharded_parallel (level {plan.sharding!r})"):
                self._sharding = GroupSharding(plan.sharding, self.model, self.optimizers, self.grad_scaler,
                                               self._group)
            self.stepped_optimizers = [self._sharding.optimizer]
            if self._sharding.scaler is not None:
                self.grad_scaler = self._sharding.scaler
            return
        if self._dp is None and any(not p.stop_gradient for p in self.model.parameters()):
            with self._collective("wrapping the model in paddle.DataParallel (it copies rank 0's weights)"):
                self._dp = fleet.distributed_model(self.model) if plan.fleet else paddle.DataParallel(
                    self.model, find_unused_parameters=plan.find_unused_parameters and plan.overlap)
        if self._dp is not None and not plan.overlap:
            self._dp.grad_need_sync = False  # gradients are averaged in step(), never by the reducer
        if plan.fleet:
            self.stepped_optimizers = [fleet.distributed_optimizer(optimizer) for optimizer in self.optimizers]
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
            with self._guard.starting():  # a failure stops the children at exit rather than waits for them
                launcher.wait_ready()
        elif plan.launch == "spawned":
            self._store = FolderStore(plan.spawn_store)
            self._store.set(READY_KEY.format(rank=plan.rank), "1")  # the parent waits for it
        if plan.launch != "existing":
            os.environ["PADDLE_DISTRI_BACKEND"] = plan.backend
            if plan.backend == "nccl":
                os.environ.setdefault("PADDLE_PG_TIMEOUT", str(int(plan.timeout * 1000)))
            # the start-up gets the timeout but at least a minute (a loaded machine starts Python slowly)
            watch = Watchdog(plan.rank, plan.world_size, startup_patience(plan.timeout),
                             limit="a minute (the start-up's limit)")
            try:
                with self._guard.starting(), watch.watch("starting the parallel environment (init_parallel_env)"):
                    if plan.fleet:
                        from paddle.distributed import fleet

                        fleet.init(is_collective=True, strategy=plan.strategy)
                    else:
                        dist.init_parallel_env()
            finally:
                watch.stop()
        if self._store is None:  # the board lives in the process group's own store
            self._store = paddle_store(plan.master or master_address())
        self._store.connect_here()  # now, while every process (and the store's host) is alive
        self._guard.board = FailureBoard(self._store, plan.rank, plan.world_size)
        # gloo's reducer aborts this process as soon as a failed peer exits: name it before then
        aborts = {"peer_grace": 0.0, "on_expiry": _END_AFTER_GRACE} if plan.overlap and plan.backend == "gloo" else {}
        watchdog = Watchdog(plan.rank, plan.world_size, self._wait_limit(), limit=self._timeout_words(_THEIRS),
                            peer_reports=self._guard.reports_now, on_start=self._store.connect_here, **aborts)
        watchdog.start()
        self._guard.watch = watchdog.watch  # bounds every collective from now on

    def _wait_limit(self) -> float:
        """How long a collective may wait: the timeout, and on CPU never past gloo's own 30 s."""
        if self.plan.backend == "gloo":
            return min(self.plan.timeout, GLOO_LIMIT + 5.0)  # gloo's own error comes first and names more
        return self.plan.timeout

    def _silent_peer(self, waited: float) -> str:
        """What happened when a collective broke and no peer said why (for :class:`CollectiveGuard`)."""
        if self.plan.backend == "gloo" and waited < GLOO_LIMIT - 2.0:  # gloo says TIMEOUT for a closed peer too
            return f"another process ended or dropped the connection after {waited:.1f} s"
        if self.plan.backend == "gloo":
            return (f"another process did not answer within {GLOO_LIMIT:g} s (paddle's gloo gives up after that; "
                    "it cannot be raised)")
        return f"another process did not answer within {self._timeout_words(_THEIRS)}"

    # ---------------------------------------------------------------------- model
    def get_model_call_fn(self, fn_name: str | None, default: str = "train_step") -> tuple[Callable, Callable]:
        """With overlap, training calls arm DataParallel's reducer; evaluation always calls the bare model."""
        fn, signature = super().get_model_call_fn(fn_name, default)
        if default == "train_step" and self._sharding is not None:
            return self._sharding.call(fn, self.model), signature
        if default != "train_step" or self._dp is None or not self.plan.overlap:
            return fn, signature
        dp = self._dp

        def armed(*args: Any, **kwargs: Any) -> Any:
            # what DataParallel.forward does after the call; here for any method (train_step, train_fn=)
            outputs = fn(*args, **kwargs)
            if dp.grad_need_sync and paddle.is_grad_enabled():
                dp._reducer.prepare_for_backward(list(dp._find_tensor(outputs)))
            return outputs

        return armed, signature

    # --------------------------------------------------------------- optimisation
    def no_sync(self) -> contextlib.AbstractContextManager:
        """DataParallel's no_sync with overlap; else nothing: gradients are averaged once per step."""
        return self._dp.no_sync() if self.plan.overlap and self._dp is not None else NULL_CONTEXT

    def backward(self, loss: Any) -> None:
        with self._collective(_IN_BACKWARD) if self.plan.overlap and self._dp is not None else NULL_CONTEXT:
            super().backward(loss)

    def step(self) -> None:
        if self._sharding is not None:  # the sharded optimizer reduces and steps its share
            super().step()
            return
        if self._params and not self.plan.overlap:
            with self._collective("averaging the gradients (all_reduce before the optimizer step)"):
                self._average_gradients()
        elif self._unchecked:  # the reducer pairs unequal buckets silently: refuse before the first update
            self._unchecked = False
            self._check_same_gradients([p for p in self._params if p.grad is not None])
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
            self._check_same_gradients(params)
        scale = 1.0 / (self.world_size if self._group is None else self._group.nranks)
        with paddle.no_grad():
            for grads in flat_buckets([p.grad for p in params], size=lambda g: g.size, dtype=lambda g: g.dtype):
                flat = paddle.concat([g.reshape([-1]) for g in grads]) if len(grads) > 1 else grads[0].reshape([-1])
                dist.all_reduce(flat, group=self._group)
                flat.scale_(scale)
                for grad, piece in zip(grads, paddle.split(flat, [g.size for g in grads]), strict=True):
                    paddle.assign(piece.reshape(grad.shape), output=grad)

    # ---------------------------------------------------------------------- state
    @contextlib.contextmanager
    def gathering_state(self) -> Iterator[None]:
        """With group sharding: the full weights (stage 3) and every share's optimizer state, for rank 0's save."""
        sharding = self._sharding
        if sharding is None:
            yield
            return
        with self._collective("gathering the sharded weights and optimizer state (group sharding)"):
            sharding.gather_parameters()
            local = [self._optimizer_state(opt, f"optimizer_states()[{i}]") for i, opt in enumerate(self.optimizers)]
            self._gathered_optimizer = [sharding.full_optimizer_state(state, self._gather_op) for state in local]
        try:
            yield
        finally:
            self._gathered_optimizer = None

    def optimizer_states(self) -> list[Any]:
        if self._gathered_optimizer is not None:
            return self._gathered_optimizer
        return super().optimizer_states()

    def _load_optimizer_state(self, optimizer: Any, state: Any, where: str) -> None:
        if self._sharding is not None and isinstance(state, Mapping):
            names = {p.name: name for name, p in self.unwrap_model().named_parameters()}
            state = self._sharding.local_share(state, names)
        super()._load_optimizer_state(optimizer, state, where)

    # ---------------------------------------------------------------- collectives
    def _barrier_op(self) -> None:
        dist.barrier()

    def _broadcast_op(self, box: list[Any], src: int) -> None:
        dist.broadcast_object_list(box, src=src)

    def _gather_op(self, obj: Any) -> list[Any]:
        out: list[Any] = []
        dist.all_gather_object(out, obj)
        return out

    def _reduce_op(self, array: np.ndarray, op: str) -> np.ndarray:
        """On the CPU for gloo, on this rank's GPU for nccl."""
        if array.dtype == np.bool_ or array.dtype.kind == "u":
            array = array.astype(np.int64)
        tensor = paddle.to_tensor(np.ascontiguousarray(array), place=self.device.place())
        dist.all_reduce(tensor, op=getattr(dist.ReduceOp, op.upper()))
        return tensor.numpy()

    def _kind(self) -> str:
        if self.plan.sharding:
            return f"PaddleDataParallelDriver, group sharding level {self.plan.sharding!r}"
        overlap = ", gradients averaged during backward" if self.plan.overlap else ""
        return f"PaddleDataParallelDriver, {'fleet collective' if self.plan.fleet else 'DataParallel'}{overlap}"
