"""What a full checkpoint contains and how it is put back: the trainer's side of the format.

Files of a checkpoint folder:

- ``model.safetensors``: the model's weights (the same file ``Trainer.save_model`` writes);
- ``training_state.safetensors``: every other framework tensor (optimizer moments,
  accumulated gradients, framework RNG states, tensors in callback states);
- ``training_state.json``: everything else, with references into the tensor file;
- ``unsafe_pickled_state.pkl``: only with ``allow_pickle=True``, the callback states
  that are not plain data;
- ``manifest.json``: format version, versions, driver, trainer position, sha256 per file.
"""

from __future__ import annotations

import json
import os
import pickle
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .._common import DrivetrainError, __version__
from .._convert import format_name, layout_record
from .._data import Position
from .._format import (
    FROZEN_KEY,
    CheckpointError,
    FileContent,
    LoadedCheckpoint,
    StateEncodingError,
    join_state,
    split_state,
)
from ..backend import Driver, capture_host_rng, restore_host_rng
from .frozen import complete_with_frozen, split_frozen

MODEL_FILE = "model.safetensors"
STATE_TENSORS = "training_state.safetensors"
STATE_JSON = "training_state.json"
PICKLE_FILE = "unsafe_pickled_state.pkl"


def process_state(driver: Driver) -> dict[str, Any]:
    """What differs between processes: random generators and gradients not yet synchronised."""
    return {"host_rng": capture_host_rng(), "framework_rng": driver.rng_state(),
            "gradients": driver.gradient_state()}


def build_checkpoint(driver: Driver, position: Position, *, callback_states: Mapping[str, Any],
                     sampler_state: Any, process_states: list[dict[str, Any]], allow_pickle: bool,
                     extra: Mapping[str, Any], sharded: bool = False,
                     save_frozen: bool = False) -> tuple[dict[str, FileContent], dict[str, Any]]:
    """Serialise everything the trainer needs to resume; returns (files, manifest fields).

    ``sharded``: the model and optimizer states go to the ranks' shard files (:mod:`.sharded`), not here.
    Frozen parameters are left out, their fingerprint kept, unless ``save_frozen`` (see :mod:`.frozen`).

    Tensor files are returned as views of the tensors (see ``Driver.tensor_file``), written
    by ``write_checkpoint`` straight from memory; nothing may change them until then.

    ``process_states`` holds :func:`process_state` of every rank, in rank order.
    """
    is_tensor = driver.is_tensor
    sections = {
        "optimizers": None if sharded else driver.optimizer_states(),
        "precision": driver.precision_state(),
        "processes": process_states,
    }
    skeleton: dict[str, Any] = {}
    tensors: dict[str, Any] = {}
    for name, value in sections.items():
        skeleton[name], found = split_state(value, is_tensor, name)
        tensors.update(found)
    pickled: dict[str, Any] = {}
    callbacks_json: dict[str, Any] = {}
    for cb_name, state in callback_states.items():
        try:
            callbacks_json[cb_name], found = split_state(state, is_tensor, f"callbacks/{cb_name}")
        except StateEncodingError as exc:
            if not allow_pickle:
                raise StateEncodingError(f"callback {cb_name!r}: {exc}") from None
            pickled[cb_name] = state
            continue
        tensors.update(found)
    skeleton["callbacks"] = callbacks_json
    skeleton["sampler"] = sampler_state
    skeleton["position"] = position.__dict__
    skeleton["optimizer_count"] = len(driver.optimizers)
    files, frozen = _model_files(driver, sharded, save_frozen)
    files[STATE_TENSORS] = driver.tensor_file(tensors)
    files[STATE_JSON] = json.dumps(skeleton).encode()
    if pickled:
        files[PICKLE_FILE] = pickle.dumps(pickled)
    manifest: dict[str, Any] = {
        "drivetrain_version": __version__,
        "driver": format_name(driver),
        "framework_version": driver.framework_version(),
        "kind": "trainer",
        "pickle": bool(pickled),
        "trainer": dict(position.__dict__, **extra),
    }
    if frozen is not None:
        manifest[FROZEN_KEY] = frozen
    if not sharded:
        manifest.update(layout_record(driver, driver.model_state()))
    return files, manifest


def build_model_checkpoint(driver: Driver, sharded: bool = False,
                           save_frozen: bool = False) -> tuple[dict[str, FileContent], dict[str, Any]]:
    """A weights-only folder: the model file (or, ``sharded``, nothing: the ranks write the shards) and a
    manifest of kind ``model``; frozen parameters as in :func:`build_checkpoint`."""
    files, frozen = _model_files(driver, sharded, save_frozen)
    if not sharded:
        files.update(_companion_files(driver, save_frozen))
    manifest: dict[str, Any] = {"drivetrain_version": __version__, "driver": format_name(driver),
                "framework_version": driver.framework_version(), "kind": "model", "pickle": False}
    if frozen is not None:
        manifest[FROZEN_KEY] = frozen
    if not sharded:
        manifest.update(layout_record(driver, driver.model_state()))
    return files, manifest


def build_merged_checkpoint(driver: Driver) -> tuple[dict[str, FileContent], dict[str, Any]]:
    """A weights-only folder of the model with its adapters folded into the base
    (:meth:`~drivetrain.Driver.merged_adapter_state`): a whole model under the base model's names."""
    merged = driver.merged_adapter_state()
    if merged is None:
        raise DrivetrainError(
            f"save_model(merge_adapters=True): driver {driver.name!r} found no adapter to merge in this model (a peft "
            "LoRA model on the torch driver has one). save_model(folder, save_frozen=True) writes the whole model "
            "as it is.")
    files: dict[str, FileContent] = {MODEL_FILE: driver.tensor_file(merged)}
    files.update(_companion_files(driver, save_frozen=True, merged=True))
    return files, {"drivetrain_version": __version__, "driver": format_name(driver),
                   "framework_version": driver.framework_version(), "kind": "model", "pickle": False,
                   "merged_adapters": True}


def _companion_files(driver: Driver, save_frozen: bool, merged: bool = False) -> dict[str, FileContent]:
    """The driver's :meth:`~drivetrain.Driver.companion_files`, refused where a name is drivetrain's own."""
    files = driver.companion_files(save_frozen=save_frozen, merged=True) if merged else \
        driver.companion_files(save_frozen=save_frozen)
    taken = sorted(set(files) & {MODEL_FILE, STATE_TENSORS, STATE_JSON, PICKLE_FILE, "manifest.json"})
    if taken or any(os.sep in name or name.startswith(".") for name in files):
        raise DrivetrainError(f"driver {driver.name!r}: companion_files() names {sorted(files)}; plain file names "
                              f"other than drivetrain's own ({taken or 'none taken'}) are accepted.")
    return files


def _model_files(driver: Driver, sharded: bool, save_frozen: bool) -> tuple[dict[str, FileContent], dict | None]:
    """The model file (without the frozen parameters unless ``save_frozen``) and the record of those left out."""
    if sharded:
        return {}, None
    written, frozen = split_frozen(driver, driver.model_state(), save_frozen)
    return {MODEL_FILE: driver.tensor_file(written)}, frozen


@dataclass
class DecodedCheckpoint:
    model: dict[str, Any]
    state: dict[str, Any]
    pickled: dict[str, Any]


def decode_checkpoint(loaded: LoadedCheckpoint, driver: Driver, allow_pickle: bool,
                      model_only: bool = False) -> DecodedCheckpoint:
    """Parse a verified checkpoint fully in memory (only the weights when ``model_only``); nothing is applied yet."""
    manifest = loaded.manifest
    where = loaded.folder
    check_format(driver, manifest, where)
    sharded = isinstance(manifest.get("sharded"), dict)
    if MODEL_FILE not in loaded.files and not sharded:
        raise CheckpointError(f"{where}: the manifest lists no {MODEL_FILE}.")
    model = {} if sharded else complete_with_frozen(driver, _parse_tensors(driver, loaded, MODEL_FILE),
                                                     manifest.get(FROZEN_KEY), where)
    state: dict[str, Any] = {}
    pickled: dict[str, Any] = {}
    if manifest.get("kind") == "trainer" and not model_only:
        for name in (STATE_TENSORS, STATE_JSON):
            if name not in loaded.files:
                raise CheckpointError(f"{where}: the manifest lists no {name}; the checkpoint is incomplete.")
        tensors = _parse_tensors(driver, loaded, STATE_TENSORS)
        try:
            skeleton = json.loads(loaded.files[STATE_JSON])
        except ValueError as exc:
            raise CheckpointError(f"{where}/{STATE_JSON} is damaged: not valid JSON ({exc}).") from exc
        try:
            state = join_state(skeleton, tensors)
        except DrivetrainError as exc:
            raise CheckpointError(f"{where}/{STATE_JSON}: {exc}") from exc
        if manifest.get("pickle") or PICKLE_FILE in loaded.files:
            if not allow_pickle:
                raise CheckpointError(
                    f"{where} contains pickled state ({PICKLE_FILE}); loading it could run code from the file. "
                    "Pass allow_pickle=True only if you trust whoever wrote this checkpoint."
                )
            pickled = pickle.loads(loaded.files[PICKLE_FILE])  # noqa: S301 - explicit opt-in above
    return DecodedCheckpoint(model, state, pickled)


def check_format(driver: Driver, manifest: Mapping[str, Any], where: str) -> None:
    """The checkpoint must be in the driver's format (its framework's drivers share one)."""
    if manifest.get("driver") != format_name(driver):
        raise CheckpointError(
            f"{where} was written by driver {manifest.get('driver')!r} but this trainer uses {driver.name!r}. A "
            "training checkpoint resumes only in the framework that wrote it (optimizers keep their state in "
            "each framework's own form); to take its model weights into this model, call "
            f"trainer.load_model({where!r}) and train on from there."
        )


def _parse_tensors(driver: Driver, loaded: LoadedCheckpoint, name: str) -> dict[str, Any]:
    try:
        return driver.tensors_from_bytes(loaded.files[name])
    except Exception as exc:
        raise CheckpointError(f"{loaded.folder}/{name} is not a readable safetensors file ({exc}).") from exc


def check_model_fits(driver: Driver, model_tensors: Mapping[str, Any], where: str) -> None:
    """Names and shapes must match before anything is copied, so a mismatch loads nothing."""
    current = driver.model_state()
    missing = sorted(set(current) - set(model_tensors))
    unexpected = sorted(set(model_tensors) - set(current))
    if missing or unexpected:
        raise CheckpointError(
            f"{where}: the saved model does not match this model; missing {missing[:10]}, "
            f"unexpected {unexpected[:10]}. Build the same model architecture as the run that saved it."
        )
    wrong = [(k, tuple(model_tensors[k].shape), tuple(current[k].shape)) for k in current
             if tuple(model_tensors[k].shape) != tuple(current[k].shape)]
    if wrong:
        raise CheckpointError(f"{where}: shapes differ (name, saved, model): {wrong[:10]}.")


def restore_process_state(driver: Driver, state: Mapping[str, Any]) -> None:
    """Give this rank its own saved random generators and pending gradients.

    With the world size unchanged every rank gets exactly its state. With another world
    size a rank takes the state of the same rank number when it existed (else rank 0's),
    and pending gradients of an unfinished accumulation cycle are dropped, since they
    were computed on another split of the data.
    """
    saved = state["processes"]
    rank, world = driver.rank, driver.world_size
    mine = saved[rank] if rank < len(saved) else saved[0]
    if len(saved) == world:
        driver.load_gradient_state(mine["gradients"])
    else:
        if any(p["gradients"] for p in saved):
            warnings.warn(
                f"the checkpoint was taken by {len(saved)} process(es) inside a gradient-accumulation cycle; "
                f"resuming on {world} drops the gradients of that unfinished cycle.",
                RuntimeWarning, stacklevel=3,
            )
        driver.load_gradient_state({})
    restore_host_rng(mine["host_rng"])
    driver.load_rng_state(mine["framework_rng"])
