"""The torch backend's extension API: what a package building an engine on top of torch may use.

An engine that drives a ``torch.nn.Module`` through its own wrapper (a ZeRO engine, a pipeline
runtime, ...) is a backend package of its own. Everything it needs from this backend is here,
and only here: the names below are documented in the backend author guide ("Building on
another backend") and stay stable within a contract version; every other module of
``drivetrain_torch`` is internal. A test fails when a name is added here without a word in
the guide.

- drivers to subclass: :class:`TorchDDPDriver` (start/stop of the torch.distributed process
  group, collectives, peer-failure detection, sampler replacement; override ``_join`` to wrap
  the module after :meth:`TorchDDPDriver._connect` joined the group),
  :class:`ShardedEngineDriver` (a TorchDDPDriver whose engine shards the model, as FSDP and
  ZeRO do, with the state rules of ``drivetrain.backend.ShardedEngineMixin``: implement its
  hooks) and
  :class:`TorchSingleDriver` (the one-process driver a factory falls back to);
- the process layout: :class:`DistPlan` (a plan dataclass to extend with the engine's
  options; :class:`ShardedPlan` adds ``state_dict``), :func:`wrapper_layout` (launcher, the
  user's group, ``nproc=``/``device=[...]``, or one process), :func:`plan_fields` (device,
  backend, rendezvous, timeout of one rank), :func:`sharded_plan_fields` (both, plus
  ``state_dict``), :data:`DIST_KWARGS` (the option docs an engine's ``<name>_kwargs`` may share);
- the model and data: :func:`call_through_wrapper` (run a named method of the module inside
  the wrapper's forward), :func:`move_to_device` (the nested batch mover),
  :data:`PRECISION_DTYPES` (``"fp16"``/``"bf16"`` to torch dtypes);
- checkpoints in the torch drivers' format: :func:`as_tensor` (a loaded value as a tensor, or
  an error naming where), :class:`ShardReader` (copy stored slices of a sharded checkpoint into
  local tensors), :func:`optimizer_key` and :func:`plain_group` (the key and param-group shape
  the torch drivers store optimizer state under); the framework-free parts (the checks before a
  sharded load, optimizer state by name or index) are ``drivetrain.backend``'s;
- :data:`SUBCLASS_HOOKS`: the protected members of :class:`TorchDDPDriver` and
  :class:`ShardedEngineDriver` a subclass may override or call (each documented in the guide too;
  the mixin's hooks are documented with it).
"""

from __future__ import annotations

from ._device import move_to_device
from ._dist_plan import DIST_KWARGS, DistPlan, ShardedPlan, plan_fields, sharded_plan_fields, wrapper_layout
from .distributed import TorchDDPDriver, call_through_wrapper
from .driver import TorchSingleDriver
from .precision import PRECISION_DTYPES
from .sharded_engine import ShardedEngineDriver
from .shards import ShardReader, optimizer_key, plain_group
from .state import as_tensor

SUBCLASS_HOOKS = ("configure", "_join", "_connect", "_collective", "_guard", "_load_optimizer_state",
                  "_peer_failures")
"""Protected members of :class:`TorchDDPDriver` an engine's driver may override (``configure``, ``_join``,
``_load_optimizer_state``) or call (``_connect``, ``_collective(what)``, ``_guard.raise_peer_failure``), and of
:class:`ShardedEngineDriver` (``_peer_failures(what)``: a context naming the failed peer of the engine's calls)."""

__all__ = [
    "DIST_KWARGS",
    "PRECISION_DTYPES",
    "SUBCLASS_HOOKS",
    "DistPlan",
    "ShardReader",
    "ShardedEngineDriver",
    "ShardedPlan",
    "TorchDDPDriver",
    "TorchSingleDriver",
    "as_tensor",
    "call_through_wrapper",
    "move_to_device",
    "optimizer_key",
    "plain_group",
    "plan_fields",
    "sharded_plan_fields",
    "wrapper_layout",
]
