"""OneflowDDPDriver: data-parallel training on oneflow.distributed and DistributedDataParallel.

One process per device, started by ``python -m oneflow.distributed.launch`` or by the
Trainer's supervisor (:mod:`._launch`); oneflow has joined its peers at import. Where
this driver differs from the single-process one:

- oneflow's ``DistributedDataParallel`` does not wrap the module: it registers hooks on
  it and returns it. Its gradient all-reduce is armed by a forward hook, so training
  calls go through a small dispatching module that DDP hooks (whatever method trains:
  ``forward``, ``train_step`` or ``train_fn=``); evaluation calls the bare model;
- ``no_sync`` cannot be had: oneflow 0.9's DDP all-reduces on every backward. Gradient
  accumulation still gives the same gradients as with ``no_sync`` (each micro-batch's
  local gradient is averaged across processes once), with one all-reduce per micro-batch;
- oneflow has no object collectives: ``broadcast_object``/``all_gather_object`` send
  pickled bytes through ``oneflow.comm`` tensor collectives (the core's defaults over
  ``_broadcast_array``/``_gather_arrays``; between this run's own processes only, files
  are never unpickled);
- dataloaders are re-sampled so each rank takes its share of every global batch
  (training) or its own contiguous shard (evaluation).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import oneflow as flow

from drivetrain.backend import (
    DataSharding,
    DistributedDriverMixin,
    DriverError,
    Watchdog,
    die_with_parent,
    reduce_gathered,
)

from . import state as _state
from ._dataloader import describe_sampling, reproducible_dataloader, unrepeated_dataloader
from ._dist_plan import DIST_KWARGS, DistPlan
from .driver import FRAMEWORK_KWARGS, OneflowSingleDriver


class _Dispatch(flow.nn.Module):
    """The module DDP hooks: its forward calls the method the loop asks for.

    oneflow's DDP re-arms its gradient all-reduce in a forward hook, so a
    ``train_step`` method must be reached through a module call, not called bare.
    That hook accepts only tensors (or a dict/list of them) as output, so the values
    of a dict output that are not tensors (a count, a string) are set aside here and
    put back by :func:`_through`.
    """

    def __init__(self, module: flow.nn.Module) -> None:
        super().__init__()
        self.module = module
        self.set_aside: tuple[Mapping, list] | None = None

    def forward(self, method: str, *args: Any, **kwargs: Any) -> Any:
        if method == "forward":
            out = self.module(*args, **kwargs)
        else:
            out = getattr(self.module, method)(*args, **kwargs)
        if isinstance(out, Mapping) and not all(isinstance(v, flow.Tensor) for v in out.values()):
            self.set_aside = (out, list(out))
            return {k: v for k, v in out.items() if isinstance(v, flow.Tensor)}
        return out


def _through(ddp: _Dispatch, method: str, args: tuple, kwargs: dict) -> Any:
    """Call ``method`` through DDP's hooks; a dict output comes back whole, in its original key order."""
    ddp.set_aside = None
    out = ddp(method, *args, **kwargs)
    if ddp.set_aside is None:
        return out
    original, keys = ddp.set_aside
    ddp.set_aside = None
    return {key: out[key] if key in out else original[key] for key in keys}


SHARDING = DataSharding(
    reproducible=reproducible_dataloader,
    unrepeated=unrepeated_dataloader,
    describe=describe_sampling,
    option="oneflow_kwargs",
    default_loader="oneflow.utils.data.DataLoader(dataset, batch_size=..., shuffle=True/False)",
    shard_yourself="sampler=oneflow.utils.data.DistributedSampler(dataset)",
    waits="DDP",
    same_batches="DistributedSampler(dataset, drop_last=True) and the same batch_size everywhere",
)


class OneflowDDPDriver(DistributedDriverMixin, OneflowSingleDriver):
    """Drives one rank of a oneflow ``DistributedDataParallel`` run (built by ``create_driver`` from a plan).

    Rank properties, dataloader sharding and the per-epoch check that every rank has as
    many batches come from :class:`drivetrain.backend.DistributedDriverMixin`.
    """

    accepted_kwargs: Mapping[str, str] = {**FRAMEWORK_KWARGS, **DIST_KWARGS}
    sharding = SHARDING

    def __init__(self, model: Any, plan: DistPlan, **options: Any) -> None:
        super().__init__(model, plan, **options)
        self._ddp: _Dispatch | None = None
        self._watchdog = Watchdog(
            plan.rank, plan.world_size, plan.timeout, limit=self._timeout_words(),
            advice="oneflow's collectives have no timeout of their own; raise oneflow_kwargs['timeout'] if a step "
                   "legitimately takes that long.")
        self._watch = self._watchdog.watch  # bounds every call that may wait for the others (oneflow's have no timeout)

    def _collective(self, what: str) -> contextlib.AbstractContextManager:
        return self._watch(what)

    # ------------------------------------------------------------------ lifecycle
    def _join(self) -> None:
        """Move the model to this rank's device and register DDP's hooks (it copies rank 0's weights)."""
        if self.plan.launch != "spawned":
            # oneflow.distributed.launch stops the others when one fails by signalling its own process group,
            # which misses them when it is not a group leader (started from a script or a CI job): a stuck
            # worker would outlive everything. So this worker gets SIGTERM when its launcher exits (Linux): not
            # SIGKILL, since on Ctrl-C that launcher exits at once, and a worker then still closes its records
            # and writes the exception checkpoint (Trainer.run() ignores the repeated signal); a worker stuck in a
            # collective is ended by the watchdog.
            die_with_parent(os.getppid(), signal.SIGTERM)()  # the preexec function, run in this process
        if self.device.type == "cuda":
            flow.cuda.set_device(self.device)
        self.model.to(self.device)
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        if not trainable:
            return
        wrong = sorted({str(p.dtype) for p in trainable if p.dtype != flow.float32})
        if wrong:
            raise DriverError(
                f"oneflow's DistributedDataParallel needs float32 parameters, but the model has {wrong}; keep the "
                "parameters in float32 and use precision='fp16'/'bf16' on CUDA for mixed precision."
            )
        with self._watch("setup (DistributedDataParallel copies rank 0's weights to every process)"):
            self._ddp = flow.nn.parallel.DistributedDataParallel(_Dispatch(self.model), **self.plan.ddp_kwargs)
            flow.comm.barrier()

    def on_exception(self) -> None:
        """Say which rank fails and why: oneflow's launcher reports only an exit code."""
        exc = sys.exc_info()[1]
        lines = str(exc).strip().splitlines() if exc is not None else []
        text = "failed" if exc is None else type(exc).__name__ + (f": {lines[0][:300]}" if lines else "")
        sys.stdout.flush()
        sys.stderr.write(f"drivetrain: rank {self.rank} of {self.world_size} failed: {text}\n")
        sys.stderr.flush()

    # ---------------------------------------------------------------------- model
    def get_model_call_fn(self, fn_name: str | None, default: str = "train_step") -> tuple[Callable, Callable]:
        """Training (``default='train_step'``) goes through DDP's hooks; evaluation calls the bare module."""
        fn, signature = super().get_model_call_fn(fn_name, default)
        if default != "train_step" or self._ddp is None:
            return fn, signature
        if fn_name is None:
            fn_name = default if callable(getattr(self.model, default, None)) else self.default_forward_name
        ddp, method = self._ddp, fn_name

        def call(*args: Any, **kwargs: Any) -> Any:
            return _through(ddp, method, args, kwargs)

        return call, signature

    def model_call(self, batch: Any, fn: Any, signature_fn: Any) -> Any:
        with self._watch("the forward"):
            return super().model_call(batch, fn, signature_fn)

    def backward(self, loss: Any) -> None:
        with self._watch("backward (the gradient all-reduce)"):
            super().backward(loss)

    def step(self) -> None:
        with self._watch("the optimizer step"):
            super().step()

    def tensor_to_numpy(self, tensor: Any) -> np.ndarray:
        with self._watch("reading a tensor (waits for pending collectives)"):
            return super().tensor_to_numpy(tensor)

    def no_sync(self) -> contextlib.AbstractContextManager:
        """A no-op: oneflow 0.9's DDP all-reduces on every backward (the accumulated result is the same)."""
        return contextlib.nullcontext()

    # ------------------------------------------------------------------ gradients
    def _grad_slot(self, param: Any) -> Any:
        """The tensor ``param``'s gradient lives in under DDP (a view of its all-reduce bucket), created if needed."""
        if param.grad is not None or self._ddp is None or not param.requires_grad:
            return param.grad
        ddp = self._ddp
        try:
            start = ddp._param_grad_offset_in_bucket[param]
            bucket = ddp._bucket_tensors[ddp._bucket_index[param]]
        except (AttributeError, KeyError) as exc:  # another oneflow release: its DDP keeps buckets differently
            raise DriverError(
                f"load_gradient_state: cannot find oneflow {flow.__version__}'s DDP gradient bucket of a parameter "
                f"({exc!r}); resume from a checkpoint taken at the end of an accumulation cycle."
            ) from exc
        param.grad = flow._C.slice_view_1d_contiguous(bucket, start, start + param.numel()).view(param.shape)
        return param.grad

    def load_gradient_state(self, grads: Mapping[str, Any]) -> None:
        _state.load_gradient_state(self.model, grads, grad_slot=self._grad_slot)

    # ---------------------------------------------------------------- collectives
    def _local(self, array: np.ndarray) -> flow.Tensor:
        """``array`` as a tensor on this rank's device (oneflow's collectives want the local rank's device)."""
        return flow.tensor(np.ascontiguousarray(array), device=self.device)

    def _barrier_op(self) -> None:
        flow.comm.barrier()

    def _gather_arrays(self, array: np.ndarray) -> list[np.ndarray]:
        tensor = self._local(array)
        out = [flow.empty(tuple(tensor.shape), dtype=tensor.dtype, device=self.device) for _ in range(self.world_size)]
        flow.comm.all_gather(out, tensor)
        return [t.numpy() for t in out]

    def _broadcast_array(self, array: np.ndarray, src: int) -> np.ndarray:
        tensor = self._local(array)
        flow.comm.broadcast(tensor, src)
        return tensor.numpy()

    def _reduce_op(self, array: np.ndarray, op: str) -> np.ndarray:
        """Gathered, then reduced in rank order (the same result everywhere)."""
        if array.dtype.kind in "biu":
            array = array.astype(np.int64)  # oneflow has no bool/uint16+ tensors; int64 holds any count
        elif array.dtype == np.float16:
            array = array.astype(np.float32)
        return reduce_gathered(self._gather_arrays(array), op)
