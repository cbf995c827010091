"""ShardedEngineDriver: the torch base of the drivers whose engine shards the model over the processes.

``driver="torch_fsdp"`` (:mod:`.fsdp`) and engine packages built on this backend (a ZeRO
engine's) start, stop and talk to their peers as :class:`TorchDDPDriver`
does, and answer the state methods by the rules of
:class:`drivetrain.backend.ShardedEngineMixin` (evaluation's gathered parameters,
``state_dict="full"`` gathering, the full optimizer state's load, the refusal inside an
accumulation cycle); a subclass implements that mixin's hooks, and names its engine in the class
statement (``class TorchFSDPDriver(ShardedEngineDriver, engine="FSDP", option=..., instead_of_ddp=...)``).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

from drivetrain.backend import ShardedEngineMixin

from ._dist_plan import ShardedPlan
from .distributed import TorchDDPDriver


class ShardedEngineDriver(ShardedEngineMixin, TorchDDPDriver):
    """A :class:`TorchDDPDriver` whose engine shards the model; checkpoints in the torch drivers' format."""

    checkpoint_format = "torch"  # the torch drivers' checkpoints: loads into driver="torch" and back
    plan: ShardedPlan

    def __init_subclass__(cls, *, engine: str | None = None, option: str = "", instead_of_ddp: str = "",
                          **kwargs: Any) -> None:
        """A subclass naming its ``engine`` (``"FSDP"``) gets the dataloader rules of :class:`TorchDDPDriver`
        with the engine and its options argument ``option`` in their messages, and ``ddp_kwargs`` refused (the
        engine wraps the model itself) with what to do ``instead_of_ddp``, ahead of its own ``not_here_kwargs``."""
        super().__init_subclass__(**kwargs)
        if engine is None:
            return
        cls.sharding = dataclasses.replace(TorchDDPDriver.sharding, option=option, waits=engine)
        ddp = (f"configures DistributedDataParallel, which driver={cls.name!r} does not use; remove it and "
               f"{instead_of_ddp}.")
        cls.not_here_kwargs = {"ddp_kwargs": ddp, **cls.__dict__.get("not_here_kwargs", {})}

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
