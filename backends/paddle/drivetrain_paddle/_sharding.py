"""paddle's group sharding for the distributed paddle driver: ``paddle_kwargs={"sharding": "os" | "os_g" | "p_g_os"}``.

``paddle.distributed.sharding.group_sharded_parallel`` wraps the model and the optimizer:
``'os'``/``'os_g'`` (paddle runs both as stage 2) give each process the optimizer state and
the reduced gradients of its own share of the parameters; ``'p_g_os'`` (stage 3) splits the
parameters too and gathers them around each layer's forward and backward. paddle does it on
GPUs, XPUs and custom devices only; the plan (:mod:`._dist_plan`) refuses the CPU with
paddle's own words before any process starts.

Checkpoints stay drivetrain's (safetensors + JSON, nothing pickled; paddle's own
``save_group_sharded_model`` pickles): every process joins :meth:`GroupSharding.gathered`,
which gathers the full weights (stage 3: ``get_all_parameters``) and, for stage 2, the
optimizer state of every share into rank 0's copy. Written for GPUs; it has not run on one yet.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable, Mapping
from typing import Any

import numpy as np
import paddle

from drivetrain.backend import DriverError, call_through_wrapper, move_nested


class GroupSharding:
    """The model and optimizer as ``group_sharded_parallel`` returned them, and how their state is read whole."""

    def __init__(self, level: str, model: paddle.nn.Layer, optimizers: list[Any], scaler: Any, group: Any) -> None:
        from paddle.distributed.sharding import group_sharded_parallel

        if len(optimizers) != 1:
            raise DriverError(
                f"paddle_kwargs['sharding']={level!r} shards one optimizer's state, but {len(optimizers)} optimizers "
                "were given; put every parameter group in one optimizer."
            )
        self.level = level
        self.inner = optimizers[0]
        self.model, self.optimizer, self.scaler = group_sharded_parallel(model, self.inner, level, scaler=scaler,
                                                                         group=group)

    def call(self, fn: Callable, layer: paddle.nn.Layer) -> Callable:
        """A training call through the sharded wrapper's forward (where stage 2/3 set up the gradient reduction
        and stage 3 gathers); a named method (``train_step``) runs as that forward, for one call."""
        wrapper = self.model
        if fn is layer or getattr(fn, "__self__", None) is not layer:
            return wrapper
        method = fn.__name__
        return lambda *args, **kwargs: call_through_wrapper(wrapper, layer, method, args, kwargs)

    def gather_parameters(self) -> None:
        """Stage 3: every process gets the full parameters (a collective); stage 2 holds them whole already."""
        if self.level == "p_g_os":
            self.model.get_all_parameters(convert2cpu=False)

    def full_optimizer_state(self, local: Mapping[str, Any], all_gather: Callable[[Any], list[Any]]) -> Any:
        """Stage 2: the states of every process's share, merged (each names its own parameters)."""
        if self.level == "p_g_os":
            raise DriverError(
                "paddle_kwargs['sharding']='p_g_os' keeps each parameter's optimizer state in slices that drivetrain "
                "cannot merge yet; checkpoint the weights with trainer.save_model(), or shard with 'os_g' (stage 2), "
                "whose checkpoints hold the whole optimizer state."
            )
        return merged_shares(all_gather(_to_numpy(local)))

    def local_share(self, state: Mapping[str, Any], names: Mapping[str, str]) -> dict[str, Any]:
        """The part of a full optimizer state this process's share updates (``names``: paddle name -> structured)."""
        params = getattr(self.inner, "_parameter_list", None) or []
        return share_of(state, {names[p.name] for p in params if p.name in names})


def share_of(state: Mapping[str, Any], own: Container[str]) -> dict[str, Any]:
    """The part of an optimizer state (:func:`drivetrain_paddle.state.optimizer_state`'s layout) that updates the
    parameters named ``own``: their accumulators and master weights, and everything not per parameter."""
    share = dict(state)
    share["accumulators"] = {base: {name: value for name, value in per.items() if name.split("@")[0] in own}
                             for base, per in state.get("accumulators", {}).items()}
    if "master_weights" in state:
        share["master_weights"] = {n: v for n, v in state["master_weights"].items() if n.split("@")[0] in own}
    return share


def merged_shares(shares: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """One optimizer state from every process's share (the inverse of :func:`share_of`): each accumulator and
    master weight from the share that has it, the names of accumulators kept on the CPU from every share, the
    rest (the learning rate) from the first."""
    merged: dict[str, Any] = {}
    for share in shares:
        for key, value in share.items():
            if key == "accumulators":
                for base, per in value.items():
                    merged.setdefault(key, {}).setdefault(base, {}).update(per)
            elif key == "master_weights":
                merged.setdefault(key, {}).update(value)
            elif key == "accumulators_on_cpu":
                merged[key] = list(dict.fromkeys([*merged.get(key, []), *value]))
            else:
                merged.setdefault(key, value)
    return merged


def _to_numpy(state: Any) -> Any:
    """Tensors become numpy arrays, so that an object collective can carry the state."""
    return move_nested(state, lambda value: isinstance(value, paddle.Tensor),
                       lambda tensor: np.array(tensor.numpy(), copy=True))
