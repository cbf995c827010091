"""What every driver whose engine shards the model over the processes answers the same way.

An engine such as torch's FSDP or DeepSpeed's ZeRO splits the parameters, gradients and
optimizer state over the ranks of a data-parallel driver (drivetrain-torch's ``torch_fsdp``
and drivetrain-deepspeed's ``deepspeed``). How it gathers or loads the pieces is the engine's;
the rules around that are the Driver contract's, and live here once:

- evaluation gathers the full parameters at ``set_model_mode("eval")`` and releases them at
  ``"train"`` (ranks may evaluate different numbers of batches, and a forward that gathered
  would then wait forever); reading or writing the state releases them first and gathers them
  again after (:meth:`ShardedEngineMixin._kept_summon`);
- ``state_dict="full"`` checkpoints: :meth:`~ShardedEngineMixin.gathering_state` gathers the
  full model and optimizer state once (rank 0 keeps it), which :meth:`model_state` and
  :meth:`optimizer_states` then return; outside it they gather now, a collective every rank joins;
- the full optimizer state (one process's ``state_dict()``) loads into the engine's pieces,
  a mismatch named with its fix;
- a checkpoint inside a gradient-accumulation cycle is refused: the engine holds the gradients.

Before the engine holds the model (``_engine_started()`` false) every method is the plain
driver's. The engine's part is the hooks below, each raising NotImplementedError here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from .._common import DriverError


class ShardedEngineMixin:
    """The state rules of a driver whose engine shards the model (see the module docstring).

    Put it before the data-parallel driver in the bases. The plan has ``state_dict``
    (``"sharded"``: every rank writes its own pieces; ``"full"``: gathered, rank 0 writes).
    """

    name: str
    state_ops: Any
    _collective: Callable[[str], contextlib.AbstractContextManager]  # the data-parallel driver's
    gradients_held = "the engine holds the gradients itself"
    """Why a checkpoint inside an accumulation cycle is refused, in the refusal's words."""
    full_state_errors: tuple[type[Exception], ...] = (IndexError, KeyError, ValueError)
    """What :meth:`_load_full_optimizer_state` raises for a state that does not fit the optimizer."""

    def __init__(self, model: Any, plan: Any, **options: Any) -> None:
        super().__init__(model, plan, **options)  # type: ignore[call-arg]
        self._summoned = False  # the full parameters are gathered for evaluation
        self._gathered: tuple[dict[str, Any], list[Any]] | None = None
        self.shards_state = plan.state_dict == "sharded"

    def is_distributed(self) -> bool:
        """A world of one is one process (its process group of one aside): it takes any dataloader, a list of
        batches too, as the single-process driver does."""
        return self.world_size > 1  # type: ignore[attr-defined]

    # ------------------------------------------------------------------ the engine's hooks
    def _engine_started(self) -> bool:
        """Whether the engine holds the model (before that, the plain driver's methods serve)."""
        raise NotImplementedError

    def _gather_parameters(self) -> None:
        """Gather the full parameters for evaluation (a collective)."""
        raise NotImplementedError

    def _release_parameters(self) -> None:
        """Free what :meth:`_gather_parameters` gathered."""
        raise NotImplementedError

    def _gather_full_state(self) -> tuple[dict[str, Any], list[Any]]:
        """Every rank: the full model state and optimizer states (rank 0's are saved)."""
        raise NotImplementedError

    def _full_model_state(self) -> dict[str, Any]:
        """Every rank: the full model state, gathered now."""
        raise NotImplementedError

    def _full_optimizer_states(self) -> list[Any]:
        """Every rank: each optimizer's full state as one process's ``state_dict()``, gathered now."""
        raise NotImplementedError

    def _load_full_model_state(self, state: Mapping[str, Any]) -> None:
        """Every rank (each read the whole state): keep its own pieces of it."""
        raise NotImplementedError

    def _load_full_optimizer_state(self, optimizer: Any, prepared: Mapping[str, Any], where: str) -> None:
        """Every rank: one process's ``state_dict()``, prepared for loading, into the engine's pieces."""
        raise NotImplementedError

    def _loads_full_state(self, prepared: Mapping[str, Any]) -> bool:
        """Whether :meth:`_load_full_optimizer_state` loads ``prepared`` (else the plain driver's load does)."""
        return True

    def _accumulating(self) -> bool:
        """Whether a gradient-accumulation cycle is open (its gradients are the engine's)."""
        raise NotImplementedError

    def _engine_gradients(self) -> dict[str, Any]:
        """The gradients between accumulation cycles, by parameter name."""
        raise NotImplementedError

    # ---------------------------------------------------------------------- evaluation
    def set_model_mode(self, mode: str) -> None:
        """``eval`` gathers the full parameters until ``train`` (see the module docstring)."""
        super().set_model_mode(mode)  # type: ignore[misc]
        if not self._engine_started():
            return
        if mode == "eval":
            self._summon()
        else:
            self._release()

    def _summon(self) -> None:
        if not self._summoned:
            self._gather_parameters()
            self._summoned = True

    def _release(self) -> None:
        if self._summoned:
            self._release_parameters()
            self._summoned = False

    @contextlib.contextmanager
    def _kept_summon(self) -> Iterator[None]:
        """Parameters gathered for evaluation are released while the state is read, and gathered again after."""
        summoned = self._summoned
        self._release()
        try:
            yield
        finally:
            if summoned:
                self._summon()

    # --------------------------------------------------------------------------- state
    @contextlib.contextmanager
    def gathering_state(self) -> Iterator[None]:
        """Every rank (``state_dict='full'`` saves): gather the full model and optimizer state once; rank 0 keeps
        it for the save."""
        if not self._engine_started() or self.shards_state:
            yield
            return
        with self._kept_summon():
            self._gathered = self._gather_full_state()
        try:
            yield
        finally:
            self._gathered = None

    def model_state(self) -> dict[str, Any]:
        """Full tensors: rank 0's gathered copy inside :meth:`gathering_state`, else gathered on every rank now
        (a collective: every rank must call it)."""
        if self._gathered is not None:
            return self._gathered[0]
        if not self._engine_started():
            return super().model_state()  # type: ignore[misc]
        with self._kept_summon(), self._collective("gathering the full model state"):
            return self._full_model_state()

    def load_model_state(self, state: Mapping[str, Any]) -> None:
        """Every rank gets the full state (each read the file) and keeps its own pieces of it."""
        if not self._engine_started():
            super().load_model_state(state)  # type: ignore[misc]
            return
        with self._kept_summon():
            self._load_full_model_state(state)

    def optimizer_states(self) -> list[Any]:
        """As :meth:`model_state`, for each optimizer: one process's ``state_dict()``."""
        if self._gathered is not None:
            return self._gathered[1]
        if not self._engine_started():
            return super().optimizer_states()  # type: ignore[misc]
        with self._collective("gathering the full optimizer state"):
            return self._full_optimizer_states()

    def _load_optimizer_state(self, optimizer: Any, state: Any, where: str) -> None:
        prepared = self.state_ops.optimizer_state_for_load(state, where)
        if not self._engine_started() or not self._loads_full_state(prepared):
            super()._load_optimizer_state(optimizer, state, where)  # type: ignore[misc]
            return
        try:
            self._load_full_optimizer_state(optimizer, prepared, where)
        except self.full_state_errors as exc:
            raise DriverError(
                f"load_optimizer_states: {where} does not fit this optimizer ({type(exc).__name__}: {exc}); build "
                "the optimizer over the same parameters, in the same groups, as the run that saved the checkpoint."
            ) from exc

    def gradient_state(self) -> dict[str, Any]:
        """Gradients between accumulation cycles; inside one the engine holds them (refused)."""
        if not self._engine_started():
            return super().gradient_state()  # type: ignore[misc]
        if self._accumulating():
            raise DriverError(
                f"driver={self.name!r} cannot checkpoint inside a gradient-accumulation cycle ({self.gradients_held}); "
                "save when a cycle ends, e.g. every N batches with N a multiple of accumulation_steps."
            )
        return self._engine_gradients()
