"""Saving and loading a Trainer: the order in which its states are gathered, written, checked and applied.

``Trainer.save_checkpoint`` / ``load_checkpoint`` / ``save_model`` / ``load_model`` are thin
wrappers around these functions. The format itself (what each file holds) is in
:mod:`.training`; the folder on disk (atomic writes, manifest, checksums) in :mod:`.folder`.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .._convert import NameMap, check_name_map, check_source_driver, format_name, load_converted, written_by
from .._data import Position, ResumedFrom, loader_position
from .._format import (
    FROZEN_KEY,
    CheckpointError,
    is_sharded,
    read_checkpoint,
    read_manifest,
    resumes_exactly,
    verified_file,
    write_checkpoint,
)
from ..backend import Driver
from .background import HostBuffers, PendingSave, host_copy
from .sharded import (
    load_shards,
    open_shards,
    start_sharded_checkpoint,
    whole_file_source,
    write_sharded_checkpoint,
)
from .training import (
    MODEL_FILE,
    build_checkpoint,
    build_merged_checkpoint,
    build_model_checkpoint,
    check_format,
    check_model_fits,
    decode_checkpoint,
    process_state,
    restore_process_state,
)


@dataclass(frozen=True)
class TrainerState:
    """What a resumable checkpoint holds of a Trainer beside its driver's state; the Trainer gathers it.

    ``callbacks``: each callback's state (``CallbackManager.states``), taken after ``on_save_checkpoint``;
    ``sampler``: the reproducible sampler whose state is saved (None: the dataloader has none, and
    ``dataloader``'s own position is saved if it reports one); ``settings``: what the manifest records about
    the run beside its position (``at_batch_boundary``, ``after_exception``, ``ended``, the loop's lengths).
    """

    position: Position
    callbacks: Mapping[str, Any]
    sampler: Any
    dataloader: Any
    settings: Mapping[str, Any]


def save_trainer(driver: Driver, folder: str | os.PathLike, state: TrainerState, allow_pickle: bool,
                 save_frozen: bool = False) -> str:
    """Write a resumable checkpoint as ``folder``; every rank calls it, rank 0 writes (each rank its shards)."""
    path = os.path.abspath(os.fspath(folder))
    files = _trainer_files(driver, state, allow_pickle, save_frozen)
    if driver.shards_state:  # every rank writes its own shards, nothing is gathered
        write_sharded_checkpoint(driver, path, lambda: files(True), optimizers=True, save_frozen=save_frozen)
        return path
    with driver.gathering_state():  # every rank: a driver that gathers its sharded state for rank 0 does it here
        if driver.is_global_zero:
            write_checkpoint(path, *files(False))
    driver.barrier()
    return path


def start_trainer_save(driver: Driver, folder: str | os.PathLike, state: TrainerState, allow_pickle: bool,
                       save_frozen: bool = False, buffers: HostBuffers | None = None) -> PendingSave:
    """:func:`save_trainer` whose files a worker thread writes: every rank returns once its part of the state
    is copied to host memory (``buffers``, see :class:`HostBuffers`); :meth:`PendingSave.finish` (every rank, main thread) waits and agrees on the
    outcome. A whole-state save is renamed into place by rank 0's writer (no other rank takes part); a
    sharded one by rank 0 in the commit, once every rank's shards are written."""
    path = os.path.abspath(os.fspath(folder))
    files = _trainer_files(driver, state, allow_pickle, save_frozen)
    if driver.shards_state:
        return start_sharded_checkpoint(driver, path, lambda: files(True), optimizers=True, save_frozen=save_frozen,
                                        buffers=buffers)
    job: list[Any] = []
    with driver.gathering_state():
        if driver.is_global_zero:
            built, manifest = files(False)
            job = [host_copy(built, buffers), manifest]

    def write() -> None:
        if job:
            content, manifest = job
            job.clear()  # the host copy goes once written
            write_checkpoint(path, content, manifest)

    return PendingSave(driver, path, write, lambda _, error: _agree_on_rank0(driver, path, error))


def _trainer_files(driver: Driver, state: TrainerState, allow_pickle: bool,
                   save_frozen: bool) -> Callable[[bool], tuple[dict, dict[str, Any]]]:
    """Every rank gathers the processes' states (a collective); the returned function builds the files and
    the manifest's fields (rank 0, or every rank for ``sharded``)."""
    sampler = state.sampler
    mine = dict(process_state(driver), loader=loader_position(state.dataloader) if sampler is None else None)
    processes = driver.all_gather_object(mine) if driver.is_distributed() else [mine]
    extra = dict(state.settings, world_size=driver.world_size)

    def files(sharded: bool) -> tuple[dict, dict[str, Any]]:
        return build_checkpoint(
            driver, state.position, callback_states=state.callbacks,
            sampler_state=None if sampler is None else sampler.state_dict(),
            process_states=processes, allow_pickle=allow_pickle, extra=extra, sharded=sharded,
            save_frozen=save_frozen,
        )

    return files


def _agree_on_rank0(driver: Driver, folder: str, error: BaseException | None) -> None:
    """Every rank, main thread: rank 0's writer's outcome, so every rank raises when its save failed (rank 0
    the writer's own error, the others a CheckpointError naming it)."""
    message = None if error is None else f"{type(error).__name__}: {error}"
    if driver.is_distributed():
        message = driver.broadcast_object(message, src=0)
    if error is not None:
        raise error
    if message is not None:
        raise CheckpointError(f"could not write checkpoint {folder} on rank 0 ({message}).")


@dataclass
class LoadedTrainer:
    """A checkpoint read, verified and applied to the driver; what the Trainer applies to itself.

    Attributes:
        callback_states: the callbacks' states as saved (what ``on_load_checkpoint`` receives).
        resume: the rest, when resuming training (None for ``resume_training=False``): the position, the
            checkpoint's summary, the sampler's state, the callbacks' states with any pickled ones, and each
            rank's saved loader position.
    """

    callback_states: dict[str, Any]
    resume: ResumeState | None = None


@dataclass
class ResumeState:
    """Where and how a resumed run continues (see :class:`LoadedTrainer`)."""

    position: Position
    resumed: ResumedFrom
    sampler_state: Any
    callback_states: dict[str, Any]
    loader_states: list[Any]
    _state: dict[str, Any]

    def restore_processes(self, driver: Driver) -> None:
        """Put this rank's random generators and unsynchronised gradients back; the last thing a resume does,
        so nothing done while loading shifts the restored generators."""
        restore_process_state(driver, self._state)


def load_trainer(driver: Driver, folder: str | os.PathLike, resume_training: bool,
                 allow_pickle: bool) -> LoadedTrainer:
    """Read, verify and parse the checkpoint ``folder`` completely, then apply the driver's part.

    Nothing is applied before everything has been checked, so a damaged or mismatched
    checkpoint leaves the driver (and the trainer) as it was.
    """
    loaded = read_checkpoint(os.fspath(folder), skip_shards=True)
    decoded = decode_checkpoint(loaded, driver, allow_pickle)
    state = decoded.state
    if loaded.manifest.get("kind") != "trainer":
        raise CheckpointError(f"{loaded.folder} holds only a model; use load_model() for it.")
    shards = open_shards(driver, loaded) if is_sharded(loaded.manifest) else None
    if shards is None:
        check_model_fits(driver, decoded.model, loaded.folder)
    saved = state.get("optimizer_count", len(state["optimizers"] or ()))
    if saved != len(driver.optimizers):
        raise CheckpointError(
            f"{loaded.folder} holds {saved} optimizer state(s) but the trainer has "
            f"{len(driver.optimizers)} optimizer(s); pass the same optimizers as the run that saved it. "
            "Nothing was loaded."
        )
    # -- everything is checked (a sharded load checks its keys and shapes before copying): apply, weights first
    if shards is not None:
        load_shards(driver, shards, optimizers=True, frozen=loaded.manifest.get(FROZEN_KEY))
    else:
        driver.load_model_state(decoded.model)
        driver.load_optimizer_states(state["optimizers"])
    if not resume_training:
        return LoadedTrainer(state["callbacks"])
    if not resumes_exactly(loaded.manifest):
        _warn_salvage(loaded.folder, loaded.manifest["trainer"])
    driver.load_precision_state(state["precision"])
    return LoadedTrainer(state["callbacks"], ResumeState(
        Position.from_state(state["position"]),
        ResumedFrom.from_manifest(loaded.folder, loaded.manifest.get("trainer", {})),
        state["sampler"], {**state["callbacks"], **decoded.pickled},
        [process.get("loader") for process in state["processes"]], state))


def _warn_salvage(folder: str, settings: dict[str, Any]) -> None:
    """Resuming from a checkpoint written while a run failed: allowed (it may be all there is), never silently."""
    when = (f"while handling {settings['after_exception']}" if settings.get("after_exception")
            else "in the middle of a batch")
    parent = os.path.dirname(os.path.abspath(folder))
    warnings.warn(
        f"{folder} was written {when} (e.g. by CheckpointCallback(save_on_exception=True)): the step it "
        "stopped in may be half done and callbacks after the failure did not run, so this resume is not "
        f"sample-exact. For an exact resume pass resume_from={parent!r} (its newest checkpoint taken between "
        "batches) or resume_from='latest'; to keep only the weights use load_model().",
        RuntimeWarning, stacklevel=4)


def _verified_model_file(driver: Any, path: str) -> str:
    """The weights file of ``path`` (a bare file, or a checkpoint folder's, its checksum streamed and its
    format checked)."""
    if os.path.isfile(path):
        return path
    folder = os.path.abspath(path)
    manifest = read_manifest(folder)
    check_format(driver, manifest, folder)
    record = manifest["files"].get(MODEL_FILE)
    if not isinstance(record, dict):
        raise CheckpointError(f"{folder}: the manifest lists no {MODEL_FILE}.")
    verified_file(folder, MODEL_FILE, record, keep=False)
    return os.path.join(folder, MODEL_FILE)


def save_model(driver: Driver, folder: str | os.PathLike, save_frozen: bool = False, merge_adapters: bool = False,
               saved: Callable[[], None] | None = None) -> str:
    """Write the model's weights as the folder ``folder``; returns the weights file's path (the folder for a
    sharded save). ``saved`` runs on every rank once the files are written (the Trainer's ``on_save_model``)."""
    path = os.path.abspath(os.fspath(folder))
    saved = saved or (lambda: None)
    if merge_adapters:
        return _save_merged(driver, path, saved)
    if driver.shards_state:
        write_sharded_checkpoint(driver, path, lambda: build_model_checkpoint(driver, sharded=True),
                                 optimizers=False, save_frozen=save_frozen)
        saved()
        return path
    with driver.gathering_state():
        if driver.is_global_zero:
            write_checkpoint(path, *build_model_checkpoint(driver, save_frozen=save_frozen))
    saved()
    driver.barrier()
    return os.path.join(path, MODEL_FILE)


def _save_merged(driver: Driver, path: str, saved: Callable[[], None]) -> str:
    if driver.shards_state:
        raise CheckpointError(
            f"save_model(merge_adapters=True) folds the adapter into the whole base model in one process; driver "
            f"{driver.name!r} shards the model. Save the adapter with save_model(folder), then in one process with "
            "driver='torch' (the same base and adapter) load_model(folder) and save_model(out, merge_adapters=True).")
    with driver.gathering_state():
        if driver.is_global_zero:
            write_checkpoint(path, *build_merged_checkpoint(driver))
    saved()
    driver.barrier()
    return os.path.join(path, MODEL_FILE)


def load_weights_into(driver: Driver, folder: str | os.PathLike, name_map: NameMap = None,
                      source_driver: str | None = None) -> None:
    """Load weights from a folder (checksums verified first) or from a bare ``.safetensors`` file, written by
    this framework's driver or (through the layout rules of :mod:`drivetrain._convert`) another's: what
    ``Trainer.load_model`` and ``drivetrain.load_weights`` do."""
    path = os.fspath(folder)
    check_name_map(name_map)
    writer = written_by(path) if os.path.exists(path) else None
    check_source_driver(path, source_driver, writer)
    writer = writer or source_driver
    if name_map is not None or (writer and writer != format_name(driver)):
        load_converted(driver, path, name_map, source_driver)
        return
    manifest = read_manifest(path) if driver.shards_state and os.path.isdir(path) else {}
    if driver.shards_state and not is_sharded(manifest):
        # a sharding driver reads a whole-file model by slices too: no rank holds the full weights
        frozen = manifest.get(FROZEN_KEY)
        source = whole_file_source(_verified_model_file(driver, path), (frozen or {}).get("tensors", ()))
        load_shards(driver, source, optimizers=False, frozen=frozen)
        return
    if os.path.isfile(path):
        tensors = driver.load_tensors(path)
    else:
        loaded = read_checkpoint(path, skip_shards=True)
        tensors = decode_checkpoint(loaded, driver, allow_pickle=False, model_only=True).model
        if is_sharded(loaded.manifest):
            load_shards(driver, open_shards(driver, loaded), optimizers=False, frozen=loaded.manifest.get(FROZEN_KEY))
            return
    try:
        check_model_fits(driver, tensors, path)
    except CheckpointError as exc:
        if writer or not os.path.isfile(path):
            raise
        raise CheckpointError(f"{exc} If the file was written by another framework (it does not say which), name "
                              "it: source_driver='torch' for a Hugging Face or other torch file.") from None
    driver.load_model_state(tensors)
