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
  :class:`DistributedError` naming that peer when it said why (see :class:`drivetrain.backend.CollectiveGuard`).

The rank properties, dataloader sharding, the collectives' shape and naming the failed peer
are the core's (:class:`drivetrain.backend.DistributedDriverMixin`, :class:`~drivetrain.backend.CollectiveGuard`);
this module supplies the framework's calls.
"""

from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from drivetrain.backend import (
    READY_KEY,
    CollectiveGuard,
    DataSharding,
    DistributedDriverMixin,
    DistributedError,
    FailureBoard,
    call_through_wrapper,
    settle_at_exit,
)

from ._dataloader import describe_sampling, reproducible_dataloader, unrepeated_dataloader
from ._dist_plan import DIST_KWARGS, DistPlan
from ._launch import start_children, torch_relaunch_command
from .driver import FRAMEWORK_KWARGS, TorchSingleDriver

__all__ = ["DistributedError", "TorchDDPDriver"]


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


def _attempt_store(master: tuple[str, int], timeout: datetime.timedelta) -> Any:
    """torchrun's store, with this restart's keys apart from the previous attempts'.

    torchrun (c10d rendezvous) lends its workers the rendezvous store and keeps it across
    ``--max-restarts``; env:// assumes a new store per attempt, so restarted gloo ranks read the
    dead attempt's addresses and cannot connect (pytorch/pytorch#135712). A prefix per
    ``TORCHELASTIC_RESTART_COUNT`` keeps attempts apart; users need not set
    ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``.
    """
    store = dist.TCPStore(master[0], master[1], is_master=False, timeout=timeout)
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(f"drivetrain/attempt_{attempt}/default_pg", store)


class TorchDDPDriver(DistributedDriverMixin, TorchSingleDriver):
    """Drives one rank of a ``DistributedDataParallel`` run (built by ``create_driver`` from a :class:`DistPlan`)."""

    accepted_kwargs: Mapping[str, str] = {**FRAMEWORK_KWARGS, **DIST_KWARGS}
    _refusal = "the process group was shut down after this process {summary}"
    sharding = DataSharding(
        reproducible=reproducible_dataloader, unrepeated=unrepeated_dataloader, describe=describe_sampling,
        option="torch_kwargs", default_loader="torch.utils.data.DataLoader(dataset, batch_size=..., shuffle=True/False)",
        shard_yourself="sampler=DistributedSampler(dataset)", waits="DDP",
        same_batches="DistributedSampler(dataset, drop_last=True) and the same batch_size everywhere",
    )

    def __init__(self, model: Any, plan: DistPlan, **options: Any) -> None:
        super().__init__(model, plan, **options)
        if plan.launch == "spawn":
            self._command = torch_relaunch_command()  # refuse a notebook / python -c before anything starts
        self._user_ddp = isinstance(model, DistributedDataParallel)
        self._ddp: DistributedDataParallel | None = model if self._user_ddp else None
        self._store: Any = None
        limit = self._timeout_words("the timeout given to init_process_group")
        self._guard = CollectiveGuard(
            plan.rank, plan.world_size, errors=(dist.DistError,),
            silent_peer=lambda waited: f"another process ended or did not answer within {limit}")

    # ------------------------------------------------------------------ lifecycle
    def _join(self) -> None:
        """Join (or start) the process group, move the model to this rank's device, wrap it in DDP."""
        self._connect()
        plan = self.plan
        module = self._bare_module()
        if self._user_ddp:
            return
        module.to(self.device)
        if any(p.requires_grad for p in module.parameters()):
            device_ids = [self.device.index] if self.device.type == "cuda" else None
            with self._collective("wrapping the model in DistributedDataParallel (it copies rank 0's weights)"):
                self._ddp = DistributedDataParallel(_Dispatch(module), device_ids=device_ids, **plan.ddp_kwargs)

    def _connect(self) -> None:
        """This process's device, the process group, and the store the failure board reports through."""
        plan = self.plan
        if plan.device.type == "cuda":
            torch.cuda.set_device(plan.device)
        self._start_process_group()
        settle_at_exit()
        self._store = dist.distributed_c10d._get_default_store()  # held: rank 0's store outlives a shutdown
        self._guard.board = FailureBoard(self._store, plan.rank, plan.world_size)

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
        if plan.launch == "single":  # a world of one (the sharding drivers in one process): nothing to meet
            with self._collective("starting a process group of one (a world of one)"):
                dist.init_process_group(store=dist.HashStore(), **options)
            return
        if plan.launch == "env":
            with self._collective(f"{what} (torchrun's MASTER_ADDR/MASTER_PORT)"):
                if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True" and plan.master is not None:
                    dist.init_process_group(store=_attempt_store(plan.master, timeout), **options)
                else:
                    dist.init_process_group(init_method="env://", **options)
            return
        if plan.launch == "spawned":
            addr, port = plan.master
            with self._collective(what):
                store = dist.TCPStore(addr, port, plan.world_size, is_master=False, timeout=timeout)
                store.set(READY_KEY.format(rank=plan.rank), "1")
                dist.init_process_group(store=dist.PrefixStore("default_pg", store), **options)
            return
        with self._guard.starting():  # a failure stops the children at exit rather than waits for them
            self._guard.launcher, store = start_children(plan.world_size, plan.timeout, plan.spawn_output,
                                                         self._command)
            self._guard.launcher.wait_ready()
            with self._collective(what):
                # the prefix env:// gives its store, so this group and the children's meet in one namespace
                dist.init_process_group(store=dist.PrefixStore("default_pg", store), **options)

    def _shut_down(self) -> None:
        """Shut the process group (the user's own is theirs to destroy)."""
        if self.plan.launch == "existing":
            return
        with contextlib.suppress(Exception):
            abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
            if self.plan.backend == "nccl" and abort is not None:
                abort()  # an NCCL communicator stuck on a dead peer would block destroy
            else:
                dist.destroy_process_group()

    # ---------------------------------------------------------------------- model
    def _bare_module(self) -> torch.nn.Module:
        """The model below DDP (possibly ``torch.compile``-d): what evaluation calls."""
        return self.model.module if self._user_ddp else self.model

    def _wrapped_model_call(self) -> Any:
        return self._bare_module()  # also where unwrap_model starts

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
                return call_through_wrapper(ddp, ddp.module, method, args, kwargs)
            except RuntimeError as exc:
                self._guard.raise_peer_failure(exc, f"the training forward ({method}) through DDP")
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
            self._guard.raise_peer_failure(exc, "backward (the gradient all-reduce)")
            raise

    # ---------------------------------------------------------------- collectives
    def _barrier_op(self) -> None:
        if self.plan.backend == "nccl":
            dist.barrier(device_ids=[self.device.index])
        else:
            dist.barrier()

    def _broadcast_op(self, box: list[Any], src: int) -> None:
        dist.broadcast_object_list(box, src=src)

    def _gather_op(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def _reduce_op(self, array: np.ndarray, op: str) -> np.ndarray:
        """On this rank's device for nccl, on the CPU for gloo."""
        if array.dtype == np.bool_ or array.dtype.kind == "u" and array.dtype != np.uint8:
            array = array.astype(np.int64)
        tensor = torch.from_numpy(np.array(array, copy=True, order="C"))
        if self.plan.backend == "nccl":
            tensor = tensor.to(self.device)
        dist.all_reduce(tensor, op=getattr(dist.ReduceOp, op.upper()))
        return tensor.cpu().numpy()
