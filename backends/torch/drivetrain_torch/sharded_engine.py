"""ShardedEngineDriver: the torch base of the drivers whose engine shards the model over the processes.

``driver="torch_fsdp"`` (:mod:`.fsdp`) and engine packages built on this backend (a ZeRO
engine's) start, stop and talk to their peers as :class:`TorchDDPDriver`
does, and answer the state methods by the rules of
:class:`drivetrain.backend.ShardedEngineMixin` (evaluation's gathered parameters,
``state_dict="full"`` gathering, the full optimizer state's load, the refusal inside an
accumulation cycle); a subclass implements that mixin's hooks.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from drivetrain.backend import ShardedEngineMixin

from ._dist_plan import ShardedPlan
from .distributed import TorchDDPDriver


class ShardedEngineDriver(ShardedEngineMixin, TorchDDPDriver):
    """A :class:`TorchDDPDriver` whose engine shards the model; checkpoints in the torch drivers' format."""

    checkpoint_format = "torch"  # the torch drivers' checkpoints: loads into driver="torch" and back
    plan: ShardedPlan

    def describe(self) -> str:
        return super().describe().replace(f" {self.name}=", " torch=")

    @contextlib.contextmanager
    def _peer_failures(self, what: str) -> Iterator[None]:
        """A collective failing inside the engine's own calls names the peer that failed, when one did."""
        try:
            yield
        except RuntimeError as exc:  # torch.distributed.DistError is one
            self._guard.raise_peer_failure(exc, what)
            raise
