"""JaxDataParallelDriver: data parallel over the processes of a ``jax.distributed`` run (gloo on CPU).

Every process holds the whole model and trains on its share of every global batch (the core's
``ReproducibleBatchSampler``). Where it differs from the one-process driver:

- gradients are averaged across processes once per optimizer step, when ``forward_backward`` is told ``sync``
  (the last batch of an accumulation cycle): each gradient becomes a global array with one row per process and
  one compiled mean, replicated, brings the average back (XLA's all-reduce over gloo); the step then runs as in
  one process, so it is not fused with the gradients. Batch norm's running statistics are averaged with them
  (torch's DDP copies rank 0's instead), so every process evaluates the same model;
- at setup every process takes rank 0's weights and optimizer state (``broadcast_one_to_all``);
- object collectives (``broadcast_object``, ``all_gather_object``, metrics' ``all_reduce``) send pickled bytes as
  uint8 arrays through ``multihost_utils``: 64-bit is off in JAX, so an int64 array in a collective would come back
  truncated; the core reduces gathered Python values exactly;
- JAX's CPU collectives have no timeout: a watchdog bounds every call that may wait for the others and ends this
  process, naming the operation and the rank, when a peer is gone.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from drivetrain.backend import DataSharding, DistributedDriverMixin, Watchdog

from . import _dataloader
from ._dist_plan import DistPlan
from .driver import JaxDriver
from .state import is_key

SHARDING = DataSharding(
    reproducible=_dataloader.reproducible,
    unrepeated=_dataloader.unrepeated,
    describe=_dataloader.describe,
    option="jax_kwargs",
    default_loader="drivetrain_jax.DataLoader(dataset, batch_size=..., shuffle=True/False)",
    shard_yourself="a loader that reads dataset[jax.process_index()::jax.process_count()]",
    waits="the gradient average",
    same_batches="the same number of batches of the same size in every process",
)


class JaxDataParallelDriver(DistributedDriverMixin, JaxDriver):
    """Drives one process of a data-parallel JAX run (built by ``create_driver`` from a plan)."""

    sharding = SHARDING
    fuses_step = False  # the gradients are averaged between the backward and the step

    def __init__(self, model: Any, plan: DistPlan, **options: Any) -> None:
        super().__init__(model, plan, **options)
        self._watch = Watchdog(plan.rank, plan.world_size, plan.timeout, limit=self._timeout_words(),
                               advice="JAX's CPU collectives have no timeout of their own; raise "
                                      "jax_kwargs['timeout'] if a step legitimately takes that long.").watch
        firsts = [next(d for d in jax.devices() if d.process_index == p) for p in range(plan.world_size)]
        mesh = Mesh(np.array(firsts), ("process",))  # each process's first device, in rank order
        self._rows = NamedSharding(mesh, PartitionSpec("process"))
        self._mean = jax.jit(lambda tree: jax.tree.map(lambda a: a.mean(0), tree),
                             out_shardings=NamedSharding(mesh, PartitionSpec()))

    def _collective(self, what: str) -> contextlib.AbstractContextManager:
        return self._watch(what)

    def _join(self) -> None:
        """Every process starts from rank 0's weights and optimizer state."""
        self._single_setup()
        for node in (self.model, *self.optimizers):
            variables = [v for _, v in nnx.to_flat_state(nnx.state(node, nnx.Not(nnx.RngState)))
                         if isinstance(v.get_raw_value(), jax.Array) and not is_key(v.get_raw_value())]
            with self._watch("setup (rank 0's weights to every process)"):
                values = multihost_utils.broadcast_one_to_all([v.get_raw_value() for v in variables],
                                                              is_source=self.rank == 0)
            for variable, value in zip(variables, values, strict=True):
                old = variable.get_raw_value()
                variable.set_raw_value(jax.device_put(np.asarray(value).astype(old.dtype), old.sharding))

    def on_exception(self) -> None:
        """Say which rank fails and why (a launcher reports only an exit code)."""
        exc = sys.exc_info()[1]
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        sys.stdout.flush()
        print(f"drivetrain: rank {self.rank} of {self.world_size} failed: {type(exc).__name__}{': ' * bool(first)}"
              f"{first}", file=sys.stderr, flush=True)

    # ------------------------------------------------------------------ the step
    def _exchange(self, grads: list[Any]) -> list[Any]:
        """The mean of every process's gradients, and of its batch statistics (so that every process evaluates the
        same model): one row per process, one compiled mean, replicated."""
        split = self._split or self._model_split()
        stats = [i for i, v in enumerate(split.variables[2]) if isinstance(v, nnx.BatchStat)]
        values = split.values(2)
        with self._watch("the gradient average"):
            rows = [jax.make_array_from_single_device_arrays((self.world_size, *a.shape), self._rows, [a[None]])
                    for a in [*grads, *(values[i] for i in stats)]]
            averaged = jax.block_until_ready([a.addressable_data(0) for a in self._mean(rows)])
        for i, value in zip(stats, averaged[len(grads):], strict=True):
            values[i] = value
        split.write(2, values)
        return averaged[:len(grads)]

    def step(self) -> None:
        with self._watch("the optimizer step"):
            super().step()

    def tensor_to_numpy(self, tensor: Any) -> np.ndarray:
        with self._watch("reading an array (it waits for pending collectives)"):
            return super().tensor_to_numpy(tensor)

    # ---------------------------------------------------------------- collectives
    def _barrier_op(self) -> None:
        multihost_utils.sync_global_devices("drivetrain barrier")

    def _gather_arrays(self, array: np.ndarray) -> list[np.ndarray]:
        return list(np.asarray(multihost_utils.process_allgather(array)))

    def _broadcast_array(self, array: np.ndarray, src: int) -> np.ndarray:
        return np.asarray(multihost_utils.broadcast_one_to_all(array, is_source=self.rank == src))
