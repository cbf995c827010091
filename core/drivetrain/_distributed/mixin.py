"""Framework-neutral parts of a data-parallel driver: failed collectives that name the peer, and sharded data.

Every distributed backend wraps its framework's collectives the same way and shards
dataloaders by the same rules; both are written here once:

- :class:`CollectiveGuard`: a collective that breaks because a peer died, raised or
  stalled raises a :class:`DistributedError` naming that peer when it said why (read
  from the :class:`~drivetrain._distributed.spawn.FailureBoard`, or from the
  :class:`~drivetrain._distributed.spawn.Launcher`'s exit codes), and after this process failed
  further collectives are refused at once instead of waiting for peers that will
  never join. The framework decides what counts as a communication error and how to
  word a peer that went silent.
- :class:`DistributedDriverMixin`: ``set_dist_repro_dataloader`` (training: a
  :class:`~drivetrain.ReproducibleBatchSampler` giving each rank its part of every
  global batch, one seed agreed by all ranks; evaluation: each rank its own
  contiguous shard), the check that every rank has as many training batches, and the
  refusal of a dataloader whose sampling cannot be replaced. The backend rebuilds its
  own dataloaders (:class:`DataSharding`). The mixin also gives the driver's lifecycle
  and collectives their shape (``setup`` once, ``on_exception`` through the guard,
  ``barrier``/``broadcast_object``/``all_gather_object``/``all_reduce`` inside
  ``_collective``, ``describe``); the backend supplies only the framework calls.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from .._common import ConfigurationError, DistributedError, DriverError, DrivetrainError
from .._data import OverfitLoader, find_reproducible_sampler
from .objects import broadcast_pickled, gather_pickled, reduce_gathered
from .spawn import FailureBoard, Launcher, exception_summary, stop_signal

COMM_ERROR_MARKERS = ("gloo", "nccl", "connection reset", "connection closed", "connection refused", "timed out",
                      "broken pipe")
"""Words in a framework's error text that say a collective broke on the connection (lower case)."""
_NO_GUARD = contextlib.nullcontext()


# --------------------------------------------------------------------------- failures
class CollectiveGuard:
    """Turns a broken collective into a :class:`DistributedError` that says which rank caused it.

    ``silent_peer(waited)`` words what happened when no peer said why (``waited``: the
    seconds the collective ran), e.g. ``"another process did not answer within
    torch_kwargs['timeout']=60 s"``. ``errors`` are the framework's exception types that
    always mean a communication failure; other ``RuntimeError``s count when their text
    holds one of ``markers``. ``error_line`` picks the line of the framework's message
    quoted at the end (0: the first, -1: the last, where a C++ traceback comes first).
    The backend sets ``launcher`` / ``board`` once it has them, and ``watch`` (``what ->
    context manager``) when a watchdog should bound every collective.
    """

    def __init__(self, rank: int, world_size: int, *, silent_peer: Callable[[float], str],
                 markers: tuple[str, ...] = COMM_ERROR_MARKERS, errors: tuple[type[BaseException], ...] = (),
                 error_line: int = 0) -> None:
        self.rank = rank
        self.world_size = world_size
        self.silent_peer = silent_peer
        self.markers = markers
        self.errors = errors
        self.error_line = error_line
        self.launcher: Launcher | None = None
        self.board: FailureBoard | None = None
        self.watch: Callable[[str], contextlib.AbstractContextManager] | None = None
        self.broken: str | None = None
        """Why collectives are refused (after this process failed), or None."""

    @contextlib.contextmanager
    def starting(self) -> Iterator[None]:
        """Wrap the start-up: if it raises, the children this process started are stopped at exit, not awaited."""
        try:
            yield
        except BaseException:
            if self.launcher is not None:
                self.launcher.note_failed()
            raise

    @contextlib.contextmanager
    def collective(self, what: str) -> Iterator[None]:
        """Run a collective described by ``what`` (``"barrier()"``); a broken one raises naming the peer."""
        if self.broken is not None:
            raise DistributedError(f"{what} on rank {self.rank} is not possible: {self.broken}.")
        watch = self.watch(what) if self.watch is not None else contextlib.nullcontext()
        started = time.monotonic()
        with watch:  # naming the peer reads the board: still watched, so it cannot hang either
            try:
                yield
            except RuntimeError as exc:
                self.raise_peer_failure(exc, what, time.monotonic() - started)
                raise

    def is_comm_error(self, exc: BaseException) -> bool:
        """Whether ``exc`` looks like a failed collective: one of the guard's error types, or a message with
        one of its markers (a closed connection, a timeout)."""
        if isinstance(exc, self.errors):
            return True
        text = str(exc).lower()
        return any(marker in text for marker in self.markers)

    def raise_peer_failure(self, exc: BaseException, what: str, waited: float = 0.0) -> None:
        """Raise a DistributedError for ``exc`` if it is a communication failure (else return)."""
        if isinstance(exc, DrivetrainError) or not self.is_comm_error(exc):
            return
        reports = self.reports(wait=1.0)
        text = str(exc).strip()
        detail = text.splitlines()[self.error_line][:300] if text else type(exc).__name__
        if reports:
            cause = "; ".join(f"rank {r} {happened}" for r, happened in sorted(reports.items()))
            raise DistributedError(
                f"{what} failed on rank {self.rank} of {self.world_size} because {cause}. This process stops too; "
                f"the cause is in that rank's own output. ({detail})"
            ) from exc
        raise DistributedError(
            f"{what} failed on rank {self.rank} of {self.world_size}: {self.silent_peer(waited)}, without saying "
            f"why (killed? out of memory? stuck?). Look at the other processes' output. ({detail})"
        ) from exc

    def reports_now(self) -> dict[int, str]:
        """What the other ranks posted, merged with (in the parent of spawned ranks) their exit codes."""
        reports = self.launcher.failures() if self.launcher is not None else {}
        if self.board is not None:
            for rank, text in self.board.reports().items():
                known = reports.get(rank)
                reports[rank] = text if known is None or known in text else f"{text}; {known}"
        return reports

    def reports(self, wait: float) -> dict[int, str]:
        """:meth:`reports_now`, polling up to ``wait`` seconds until some rank said something."""
        deadline = time.monotonic() + wait
        while True:
            reports = self.reports_now()
            if reports or time.monotonic() >= deadline:
                return reports
            time.sleep(0.1)

    def fail(self, exc: BaseException | None, *, grace: float, broken: str) -> bool:
        """This process failed with ``exc`` (from ``Driver.on_exception``): post why, and maybe refuse collectives.

        Returns True when collectives are now refused with ``broken`` (``{summary}`` is
        replaced by one line about ``exc``), so the backend may shut its group down. When
        every rank fails within ``grace`` seconds (an error on all of them, Ctrl-C), it
        returns False and collectives stay allowed, so callbacks can still save a
        checkpoint on the way out.
        """
        if self.launcher is not None:
            self.launcher.note_failed()  # at exit, stop the children rather than wait for them
            signum = stop_signal(exc)
            if signum is not None:
                self.launcher.pass_on(signum)  # Ctrl-C on this process alone stops every rank
        if self.broken is not None or self.board is None:
            return False
        if not isinstance(exc, DistributedError):
            self.board.post_failure(exception_summary(exc))
            if self.board.all_failed(grace):
                return False
        self.broken = broken.format(summary=exception_summary(exc))
        return True


_settled = False


def settle_at_exit() -> None:
    """At exit, give gloo's worker threads a moment with the GIL before the interpreter finalises.

    A gloo worker drops a finished collective's tensors a little after the caller
    returns, and dropping a tensor made in Python needs the GIL; if that happens while
    the interpreter finalises, the thread is killed mid-destructor and the process
    aborts ("terminate called without an active exception", exit code -6), which a
    launcher reports as a failure. Measured with torch: 17 of 30 two-process runs ending
    right after an all_gather aborted; with this pause, 0 of 30.
    """
    global _settled
    if not _settled:
        _settled = True
        atexit.register(time.sleep, 0.05)


def reducible_array(array: Any) -> np.ndarray:
    """``array`` as a numpy array ``Driver.all_reduce`` can reduce (numeric), else a DriverError."""
    array = np.asarray(array)
    if array.dtype.kind not in "biuf":
        raise DriverError(
            f"all_reduce: an array of dtype {array.dtype} cannot be reduced; metric elements must be numeric."
        )
    return array


# ------------------------------------------------------------------------------ data
@dataclasses.dataclass(frozen=True)
class DataSharding:
    """How a backend rebuilds its dataloaders for :class:`DistributedDriverMixin`, and the words of its errors.

    ``reproducible(loader, *, num_replicas, rank, even_batches, agree_seed)`` returns the
    loader with a :class:`~drivetrain.ReproducibleBatchSampler` (or ``loader`` itself when
    its sampling cannot be replaced), raising ``ConfigurationError`` for ``even_batches``;
    ``unrepeated(loader, *, num_replicas, rank)`` returns this rank's evaluation shard or
    None; ``describe(loader)`` says why its sampling cannot be replaced.
    """

    reproducible: Callable[..., Any]
    unrepeated: Callable[..., Any]
    describe: Callable[[Any], str]
    option: str
    """The Trainer argument holding the backend's options, e.g. ``"torch_kwargs"``."""
    default_loader: str
    """How to build a loader with default sampling, e.g. ``"torch.utils.data.DataLoader(dataset, ...)"``."""
    shard_yourself: str
    """An example of sharding by hand, e.g. ``"sampler=DistributedSampler(dataset)"``."""
    waits: str
    """What waits forever when ranks have different numbers of batches, e.g. ``"DDP"``."""
    same_batches: str
    """How to give every rank as many batches, e.g. ``"DistributedSampler(dataset, drop_last=True)"``."""


class DistributedDriverMixin:
    """Rank properties, dataloader sharding, lifecycle and collectives for a data-parallel :class:`~drivetrain.Driver`.

    Put it before the single-process driver in the bases; the driver is built from the model and
    its :class:`~drivetrain._distributed.options.DistPlan` (kept in ``self.plan``; the single-process
    driver gets ``plan.device`` and every other option) and says how to rebuild
    its dataloaders in the class attribute ``sharding``. The framework's part is a few
    hooks: ``_join()`` (the first ``setup``), ``_barrier_op()``,
    ``_broadcast_op(box, src)`` (``box[0]`` of rank ``src`` into every rank's ``box``),
    ``_gather_op(obj)`` (every rank's object) and ``_reduce_op(array, op)`` (a numeric
    array reduced over the ranks), each run inside :meth:`_collective` (or, where the
    framework has no object collectives, ``_broadcast_array`` and ``_gather_arrays``); and, for a
    driver with a :class:`CollectiveGuard` in ``_guard``, ``_shut_down()`` once
    collectives are refused after a failure.
    """

    plan: Any
    sharding: DataSharding
    _guard: CollectiveGuard | None = None
    _all_failed_grace = 2.0
    """Seconds to wait for every rank to fail too (then collectives stay allowed, to save on the way out)."""
    _refusal = "this process {summary}"
    """Why collectives are refused after this process failed (``{summary}``: one line about the exception)."""

    def __init__(self, model: Any, plan: Any, **options: Any) -> None:
        super().__init__(model, plan.device, **options)  # type: ignore[call-arg]
        self.plan = plan

    # ------------------------------------------------------------------ lifecycle
    def setup(self) -> None:
        """Join the run and prepare the model, once: a later call (another run or evaluate) keeps that."""
        if self.__dict__.get("_joined"):
            return
        self._joined = True
        self._join()

    def _join(self) -> None:
        raise NotImplementedError

    def _single_setup(self) -> None:
        """The single-process driver's ``setup`` (the device, the model's placement), for ``_join``."""
        super().setup()  # type: ignore[misc]

    def on_exception(self) -> None:
        """Post why this process fails, so that peers blocked in a collective with it can name it.

        When every rank fails together (an error on all of them, Ctrl-C) collectives stay
        allowed, so that callbacks can still save a checkpoint on the way out; otherwise
        further collectives are refused (a peer would never join them) and ``_shut_down`` runs.
        """
        guard = self._guard
        if guard is not None and guard.fail(sys.exc_info()[1], grace=min(self._all_failed_grace, self.plan.timeout),
                                            broken=self._refusal):
            self._shut_down()

    def _shut_down(self) -> None:
        """After a failure, with collectives refused: release the framework's process group (if it should)."""

    def describe(self) -> str:
        """The single-process description with this process's place in the run (and the communication
        backend, when the framework has several)."""
        _, _, details = super().describe().partition(") ")  # type: ignore[misc]
        backend = getattr(self.plan, "backend", None)
        via = f" backend={backend}" if backend not in (None, self.name) else ""  # type: ignore[attr-defined]
        return (f"{self.name} driver ({self._kind()}) rank {self.rank}/{self.world_size}{via} "  # type: ignore[attr-defined]
                f"{details}")

    def _kind(self) -> str:
        return type(self).__qualname__

    def is_distributed(self) -> bool:
        """Always True: this driver runs one process per rank."""
        return True

    @property
    def rank(self) -> int:
        """This process's global rank (0 .. world_size-1)."""
        return self.plan.rank

    @property
    def local_rank(self) -> int:
        """This process's rank on its machine (which device it takes)."""
        return self.plan.local_rank

    @property
    def world_size(self) -> int:
        """The number of processes taking part."""
        return self.plan.world_size

    def _timeout_words(self, existing: str = "") -> str:
        """How messages name the collectives' timeout (``torch_kwargs['timeout']=60 s``), or ``existing``
        when the user started the process group (its timeout is theirs)."""
        if existing and self.plan.launch == "existing":
            return existing
        return f"{self.sharding.option}['timeout']={self.plan.timeout:g} s"

    # ---------------------------------------------------------------- collectives
    def _collective(self, what: str) -> contextlib.AbstractContextManager:
        """What every collective runs in: the guard's (a broken one names the peer), when there is one."""
        return self._guard.collective(what) if self._guard is not None else _NO_GUARD

    def barrier(self) -> None:
        """Wait until every rank gets here; a failed or stuck peer raises :class:`drivetrain.DistributedError`
        naming it instead of hanging."""
        with self._collective("barrier()"):
            self._barrier_op()

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        """Rank ``src``'s ``obj`` on every rank (a picklable Python object); raises DriverError for a ``src``
        that is not a rank."""
        if isinstance(src, bool) or not isinstance(src, int) or not 0 <= src < self.world_size:
            raise DriverError(f"broadcast_object(src={src!r}): src must be a rank in 0..{self.world_size - 1}.")
        box = [obj if self.rank == src else None]
        with self._collective("broadcast_object()"):
            self._broadcast_op(box, src)
        return box[0]

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, as a list in rank order, on every rank."""
        with self._collective("all_gather_object()"):
            return self._gather_op(obj)

    def all_reduce(self, array: np.ndarray, op: str = "sum") -> np.ndarray:
        """Reduce a numeric numpy array over the ranks (``sum``, ``max``, ``min``)."""
        super().all_reduce(array, op)  # type: ignore[misc]
        array = reducible_array(array)
        with self._collective("all_reduce()"):
            return self._reduce_op(array, op)

    def _check_same_gradients(self, params: list[Any]) -> None:
        """Once, for a backend that averages gradients itself: every process must have gradients for the same
        ``params`` (else the flat all-reduce would mix up tensors), which holds unless ranks use different ones."""
        if self.__dict__.get("_gradients_checked"):
            return
        self._gradients_checked = True
        names = {id(p): name for name, p in self.model.named_parameters()}  # type: ignore[attr-defined]
        mine = [names.get(id(p), "?") for p in params]
        everyone = self.all_gather_object(mine)
        if any(other != mine for other in everyone):
            differ = sorted(set().union(*map(set, everyone)) - set.intersection(*map(set, everyone)))
            raise DriverError(
                f"the processes computed gradients for different parameters (e.g. {differ[:5]}): a parameter "
                f"was not used by every process in this step. Pass {self.sharding.option}={{'find_unused_parameters': "
                "True} to average every parameter's gradient (a zero one where it was not used)."
            )

    def _barrier_op(self) -> None:
        raise NotImplementedError

    # For a framework without object collectives the defaults below need two array collectives only:
    # ``_broadcast_array(array, src)`` and ``_gather_arrays(array)``. Objects travel pickled, and ``all_reduce``
    # reduces the gathered arrays in numpy, in rank order: exact for every dtype, the same on every rank.
    def _broadcast_op(self, box: list[Any], src: int) -> None:
        box[0] = broadcast_pickled(box[0], src, self.rank, self._broadcast_array)

    def _gather_op(self, obj: Any) -> list[Any]:
        return gather_pickled(obj, self._gather_arrays)

    def _reduce_op(self, array: np.ndarray, op: str) -> np.ndarray:
        return reduce_gathered(self._gather_op(array), op)  # objects: arrays of other shapes fail by name

    def _broadcast_array(self, array: np.ndarray, src: int) -> np.ndarray:
        """Rank ``src``'s ``array`` on every rank (the others pass one of the same shape and dtype)."""
        raise NotImplementedError

    def _gather_arrays(self, array: np.ndarray) -> list[np.ndarray]:
        """Every rank's ``array`` (one shape and dtype everywhere), in rank order."""
        raise NotImplementedError

    def check_dataloader_legality(self, dataloader: Any, argument: str = "train_dataloader") -> None:
        """Check ``dataloader`` as the single driver does, remembering which argument it came from so a later
        sharding error names it."""
        self._argument_names()[id(dataloader)] = argument  # named again if its sampling cannot be replaced
        super().check_dataloader_legality(dataloader, argument)  # type: ignore[misc]

    def _argument_names(self) -> dict[int, str]:
        """The Trainer argument each dataloader was passed as (``id(loader) -> "train_dataloader"``)."""
        return self.__dict__.setdefault("_dataloader_arguments", {})

    def set_dist_repro_dataloader(self, dataloader: Any, *, dist: str | None, reproducible: bool) -> Any:
        """Shard ``dataloader`` over the ranks (``dist``) and make it resumable (``reproducible``).

        ``"train"``: a :class:`~drivetrain.ReproducibleBatchSampler` gives each rank its part
        of every global batch, with one seed for all ranks (rank 0's, broadcast).
        ``"eval"``: each rank reads a contiguous shard, every sample once. A dataloader
        whose sampling cannot be replaced is refused with what to do instead.
        """
        if dist not in (None, "train", "eval"):
            raise DriverError(f"set_dist_repro_dataloader(dist={dist!r}): use None, 'train' or 'eval'.")
        sharding = self.sharding
        if dist == "eval":
            if isinstance(dataloader, OverfitLoader):
                return dataloader  # replays this rank's own training batches
            shard = sharding.unrepeated(dataloader, num_replicas=self.world_size, rank=self.rank)
            if shard is None:
                self._refuse(dataloader, "evaluate_dataloaders", "evaluation gives each of the {w} processes its "
                             "own shard of the data", "evaluate_use_dist_sampler=False")
            return shard
        if dist is None and not reproducible:
            return dataloader
        train = dist == "train"
        try:
            loader = sharding.reproducible(
                dataloader, num_replicas=self.world_size if train else 1, rank=self.rank if train else 0,
                even_batches=self.plan.even_batches and train,
                agree_seed=lambda seed: self.broadcast_object(seed, src=0))
        except ConfigurationError as exc:
            raise DriverError(f"{sharding.option}['even_batches']=True: {exc}") from None
        if train and find_reproducible_sampler(loader) is None:
            self._refuse(dataloader, "train_dataloader", "distributed training gives each of the {w} processes "
                         "its share of every batch by replacing the dataloader's sampling", "use_dist_sampler=False")
        return loader

    def _refuse(self, dataloader: Any, default_name: str, purpose: str, opt_out: str) -> None:
        name = self._argument_names().get(id(dataloader), default_name)
        sharding = self.sharding
        raise DriverError(
            f"{name}={type(dataloader).__name__}: {purpose.format(w=self.world_size)}, but "
            f"{sharding.describe(dataloader)}. Either build it with default sampling, {sharding.default_loader}, "
            f"or pass {opt_out} to the Trainer and shard the data yourself (e.g. {sharding.shard_yourself}); "
            "every process must then yield the same number of training batches."
        )

    def set_sampler_epoch(self, dataloader: Any, epoch: int) -> None:
        """Set the epoch, and check that every rank has as many batches (else a collective would wait forever)."""
        super().set_sampler_epoch(dataloader, epoch)  # type: ignore[misc]
        try:
            count: int | None = len(dataloader)
        except TypeError:
            count = None
        counts = self.all_gather_object(count)
        if len(set(counts)) > 1:
            listed = ", ".join(f"rank {r}: {c}" for r, c in enumerate(counts))
            raise DriverError(
                f"epoch {epoch}: the processes have different numbers of training batches ({listed}); "
                f"{self.sharding.waits} would wait forever for the missing ones. With use_dist_sampler=False each "
                f"process's dataloader must yield the same number of batches (e.g. {self.sharding.same_batches}), "
                "or let drivetrain split the data (use_dist_sampler=True)."
            )
