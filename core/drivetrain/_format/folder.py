"""The checkpoint folder on disk: atomic writing, the manifest, verification, finding the newest.

A checkpoint is written into ``.tmp-<name>-<pid>-<random>`` next to its final
name; every file is fsynced, the manifest (with a sha256 per file) is written
last, the folder is fsynced and renamed into place, then the parent is fsynced.
A crash at any point leaves either the previous state or a ``.tmp-`` folder that
readers ignore and the next resume removes.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import threading
import time
import uuid
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .._common import DrivetrainError, fsync_dir
from . import safetensors_writer
from .safetensors_writer import TensorEntry

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
TEMP_PREFIX = ".tmp-"
OLD_PREFIX = TEMP_PREFIX + "old-"
_HASH_CHUNK = 8 << 20


class CheckpointError(DrivetrainError, ValueError):
    """A checkpoint cannot be read: damaged, incomplete, too new, or for another driver."""


FileContent = bytes | Sequence[TensorEntry]
"""What a checkpoint file holds: ready bytes, or a tensor file streamed from the tensors' memory."""


def _write_and_hash(path: str, content: FileContent) -> tuple[str, int]:
    """Write one file durably while hashing it on a second thread; return (sha256 hex, size)."""
    if isinstance(content, (bytes, bytearray, memoryview)):
        return safetensors_writer.write_parts(path, [content])
    return safetensors_writer.write_file(path, content)


def write_checkpoint(folder: str, files: Mapping[str, FileContent], manifest: dict[str, Any]) -> str:
    """Write ``files`` and the manifest as the folder ``folder``, atomically.

    A file is given as bytes or as a tensor file (a list of ``(name, dtype, shape,
    buffer)``, see :mod:`.safetensors_writer`), which is written as safetensors straight
    from the tensors' memory; either way its sha256 and size go into the manifest.

    An existing ``folder`` is replaced only once the new one is complete.
    """
    folder = os.path.abspath(folder)
    tmp = temp_name(folder)
    try:
        try:
            os.makedirs(os.path.dirname(folder), exist_ok=True)
            os.mkdir(tmp)
        except OSError as exc:
            raise _write_error(exc, folder, "(creating its folder)") from exc
        records = write_files(folder, tmp, files)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finish_checkpoint(folder, tmp, records, manifest)
    return folder


def temp_name(folder: str) -> str:
    """A fresh name beside ``folder`` for building it: readers ignore it, the next resume removes leftovers."""
    parent, name = os.path.split(os.path.abspath(folder))
    return os.path.join(parent, f"{TEMP_PREFIX}{name}-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def write_files(folder: str, tmp: str, files: Mapping[str, FileContent]) -> dict[str, dict[str, Any]]:
    """Write each of ``files`` durably into ``tmp`` (the folder being built for ``folder``); return the
    manifest records ``{file: {"sha256", "size"}}``. An OSError names the checkpoint and the file."""
    records = {}
    for current, content in files.items():
        try:
            sha256, size = _write_and_hash(os.path.join(tmp, current), content)
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)  # first: the free space the message reports counts them out
            raise _write_error(exc, folder, current, needed=sum(map(_size_of, files.values()))) from exc
        records[current] = {"sha256": sha256, "size": size}
    return records


def _size_of(content: FileContent) -> int:
    """The bytes a file's content takes (a tensor file: its tensors' bytes, without the small header)."""
    if isinstance(content, (bytes, bytearray)):
        return len(content)
    if isinstance(content, memoryview):
        return content.nbytes
    return sum(memoryview(entry[3]).nbytes for entry in content)


def _write_error(exc: OSError, folder: str, current: str, needed: int | None = None) -> OSError:
    space = ""
    if exc.errno == errno.ENOSPC:  # say how far off: the files' bytes against what the disk has left
        free = shutil.disk_usage(os.path.dirname(folder)).free if os.path.isdir(os.path.dirname(folder)) else 0
        wanted = f"about {_megabytes(needed)} for its files" if needed is not None else "more"
        space = (f" (the checkpoint needs {wanted}; {_megabytes(free)} free on that filesystem once its partial "
                 "files were removed: free some space or save elsewhere)")
    return type(exc)(exc.errno, f"could not write checkpoint {folder} ({current}): {exc.strerror or exc}{space}; "
                                "its partial files are removed and the previous checkpoint under this name, if any, "
                                "is unchanged")


def _megabytes(n: int) -> str:
    return f"{n} bytes" if n < 1 << 20 else f"{n / (1 << 20):.1f} MiB"


def finish_checkpoint(folder: str, tmp: str, records: Mapping[str, Any], manifest: dict[str, Any]) -> None:
    """Write the manifest into ``tmp`` (whose files ``records`` lists) and rename it to ``folder``, replacing
    any previous checkpoint there only now that the new one is complete. ``tmp`` is removed on failure."""
    parent, name = os.path.split(folder)
    current = MANIFEST
    try:
        body = dict(manifest, format_version=FORMAT_VERSION, created=time.time(), files=dict(records))
        _write_and_hash(os.path.join(tmp, MANIFEST), json.dumps(body, indent=1, sort_keys=True).encode())
        fsync_dir(tmp)
        current = "(renaming into place)"
        if os.path.exists(folder):
            # Two renames: a crash between them leaves the old checkpoint as .tmp-old-<name>-*,
            # which recover_replaced() puts back before anything reads the parent folder.
            old = os.path.join(parent, f"{OLD_PREFIX}{name}-{uuid.uuid4().hex[:8]}")
            os.rename(folder, old)
            os.rename(tmp, folder)
            fsync_dir(parent)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, folder)
        fsync_dir(parent)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise _write_error(exc, folder, current) from exc
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def remove_checkpoint(folder: str, *, background: bool = False) -> threading.Thread | None:
    """Delete a checkpoint so that a crash midway leaves only an ignored temp folder.

    ``background``: the checkpoint leaves its real name at once, and its files (freeing a large model's
    blocks takes a while) are deleted by a thread of their own while the caller goes on; returned, to join."""
    parent, name = os.path.split(os.path.abspath(folder))
    doomed = os.path.join(parent, f"{TEMP_PREFIX}del-{name}-{uuid.uuid4().hex[:8]}")
    os.rename(folder, doomed)
    fsync_dir(parent)
    if background:
        thread = threading.Thread(target=shutil.rmtree, args=(doomed, True), name=f"drivetrain-remove-{name}")
        thread.start()
        return thread
    shutil.rmtree(doomed, ignore_errors=True)
    return None


@dataclass
class LoadedCheckpoint:
    folder: str
    manifest: dict[str, Any]
    files: dict[str, bytes]


def read_manifest(folder: str) -> dict[str, Any]:
    path = os.path.join(folder, MANIFEST)
    if not os.path.exists(folder):
        raise CheckpointError(
            f"{folder} does not exist (a relative path starts at the current directory, {os.getcwd()}); pass "
            "the folder that save_model()/save_checkpoint() or CheckpointCallback wrote."
        )
    if not os.path.isdir(folder):
        raise CheckpointError(f"{folder} is a file, not a checkpoint folder; pass the folder that holds {MANIFEST}.")
    if not os.path.isfile(path):
        raise CheckpointError(
            f"{folder} is not a checkpoint: it has no {MANIFEST} (an interrupted save leaves no manifest; "
            "pass a complete checkpoint folder, or its parent to take the newest complete one)."
        )
    try:
        with open(path, "rb") as f:
            manifest = json.loads(f.read())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path} is damaged: not valid JSON ({exc}).") from exc
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        raise CheckpointError(f"{path} is damaged: it lacks the 'files' table.")
    version = manifest.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise CheckpointError(
            f"{path} has checkpoint format version {version!r}, written by drivetrain "
            f"{manifest.get('drivetrain_version', '?')}; this drivetrain reads format versions up to "
            f"{FORMAT_VERSION}. Upgrade drivetrain to load it."
        )
    return manifest


def read_checkpoint(folder: str, *, skip_shards: bool = False) -> LoadedCheckpoint:
    """Read the manifest and every file it lists, verifying size and sha256 before anything is parsed.

    The shard files of a sharded checkpoint are verified without being kept (their readers map
    them); ``skip_shards=True`` leaves them to the caller (``sharded.open_shards`` splits the
    hashing between the ranks).
    """
    folder = os.path.abspath(folder)
    manifest = read_manifest(folder)
    sharded = manifest.get("sharded")
    shards = set(sharded.get("files", ())) if isinstance(sharded, dict) else set()
    files = {}
    for filename, record in manifest["files"].items():
        if filename not in shards:
            files[filename] = verified_file(folder, filename, record)
        elif not skip_shards:
            verified_file(folder, filename, record, keep=False)
    return LoadedCheckpoint(folder, manifest, files)


def verified_file(folder: str, filename: str, record: Mapping[str, Any], *, keep: bool = True) -> bytes:
    """The file ``filename`` of ``folder`` after checking its size and sha256 against its manifest ``record``.

    ``keep=False`` streams the file through the hash without holding it (weights may exceed memory)
    and returns ``b""``.
    """
    path = os.path.join(folder, filename)
    if os.path.basename(filename) != filename:
        raise CheckpointError(f"{os.path.join(folder, MANIFEST)} is damaged: file name {filename!r} is not plain.")
    data, size, digest = b"", 0, hashlib.sha256()
    try:
        with open(path, "rb") as f:
            if keep:
                data = f.read()
                size = len(data)
                digest.update(data)
            else:
                while chunk := f.read(_HASH_CHUNK):
                    size += len(chunk)
                    digest.update(chunk)
    except FileNotFoundError:
        raise CheckpointError(f"{path} is missing; the checkpoint {folder} is incomplete.") from None
    if size != record.get("size"):
        raise CheckpointError(f"{path} is damaged: {size} bytes where the manifest says {record.get('size')} (truncated?).")
    if digest.hexdigest() != record.get("sha256"):
        raise CheckpointError(f"{path} is damaged: its sha256 does not match the manifest.")
    return data


def is_complete(folder: str) -> bool:
    name = os.path.basename(folder)
    return not name.startswith(TEMP_PREFIX) and os.path.isfile(os.path.join(folder, MANIFEST))


def list_checkpoints(parent: str) -> list[tuple[str, dict[str, Any]]]:
    """Complete checkpoints directly under ``parent`` with their manifests, oldest progress first."""
    found: list[tuple[str, dict[str, Any]]] = []
    if not os.path.isdir(parent):
        return found
    for entry in os.scandir(parent):
        if entry.is_dir() and is_complete(entry.path):
            try:
                found.append((entry.path, read_manifest(entry.path)))
            except CheckpointError:
                continue
    found.sort(key=lambda item: (item[1].get("trainer", {}).get("global_forward_batches", -1),
                                 item[1].get("created", 0)))
    return found


def recover_replaced(parent: str) -> list[str]:
    """Put back checkpoints that a crash left renamed away while being replaced; return them."""
    restored: list[str] = []
    if not os.path.isdir(parent):
        return restored
    for entry in os.scandir(parent):
        if not (entry.is_dir() and entry.name.startswith(OLD_PREFIX)):
            continue
        name = entry.name[len(OLD_PREFIX):].rsplit("-", 1)[0]
        final = os.path.join(parent, name)
        if name and not os.path.exists(final) and os.path.isfile(os.path.join(entry.path, MANIFEST)):
            os.rename(entry.path, final)
            restored.append(final)
    if restored:
        fsync_dir(parent)
    return restored


def remove_temp_folders(parent: str) -> list[str]:
    """Delete leftovers of interrupted saves/deletes in ``parent``; return what was removed."""
    removed = []
    if os.path.isdir(parent):
        for entry in os.scandir(parent):
            if entry.is_dir() and entry.name.startswith(TEMP_PREFIX):
                shutil.rmtree(entry.path, ignore_errors=True)
                removed.append(entry.path)
    return removed


def _manifest_error(folder: str) -> str | None:
    try:
        read_manifest(folder)
    except CheckpointError as exc:
        return str(exc)
    return None


def _newest_training_checkpoint(path: str) -> tuple[str, dict[str, Any]] | None:
    """The newest complete training checkpoint taken between batches directly under ``path``, with its manifest.

    Tidies ``path`` first (puts back replaced checkpoints, removes temp folders) and warns about damaged ones.
    """
    recover_replaced(path)
    remove_temp_folders(path)
    damaged = [entry.path for entry in os.scandir(path) if entry.is_dir() and is_complete(entry.path)
               and _manifest_error(entry.path)]
    if damaged:
        warnings.warn(f"resume_from={path!r}: skipping checkpoint(s) with a damaged manifest: {damaged}",
                      RuntimeWarning, stacklevel=4)
    # Weights-only folders cannot resume training, and a checkpoint written after an exception
    # (maybe in the middle of a batch) is taken only when named explicitly.
    found = [(folder, manifest) for folder, manifest in list_checkpoints(path)
             if manifest.get("kind") == "trainer" and resumes_exactly(manifest)]
    skipped: list[str] = []
    for folder, manifest in reversed(found):  # newest first: the first intact one is taken
        why = damage_of(folder, manifest)
        if why is None:
            if skipped:
                warnings.warn(f"resume_from={path!r}: skipping damaged checkpoint(s), newest first: "
                              f"{'; '.join(skipped)}. Resuming from the newest intact one, {folder}.",
                              RuntimeWarning, stacklevel=4)
            return folder, manifest
        skipped.append(f"{folder} ({why})")
    if skipped:
        warnings.warn(f"resume_from={path!r}: every training checkpoint there is damaged: {'; '.join(skipped)}.",
                      RuntimeWarning, stacklevel=4)
    return None


def damage_of(folder: str, manifest: Mapping[str, Any]) -> str | None:
    """Why the checkpoint ``folder`` cannot be loaded (a file missing, truncated, or not matching its sha256,
    shards included), or None when every file its manifest lists is intact. Reads every byte once."""
    for filename, record in manifest["files"].items():
        try:
            verified_file(folder, filename, record, keep=False)
        except CheckpointError as exc:
            return str(exc)
    return None


def resumes_exactly(manifest: dict[str, Any]) -> bool:
    """Whether a training checkpoint was written at a point a run can continue from exactly: between
    batches, with every callback done for the last step (not while handling an exception)."""
    trainer = manifest.get("trainer", {})
    return bool(trainer.get("at_batch_boundary", True)) and not trainer.get("after_exception")


def resolve_resume_folder(path: str | os.PathLike) -> str:
    """``path`` itself if it is a checkpoint, else the newest complete checkpoint inside it."""
    path = os.path.abspath(os.fspath(path))
    if not os.path.exists(path):
        raise FileNotFoundError(f"resume_from={path!r} does not exist.")
    if os.path.isfile(os.path.join(path, MANIFEST)):
        return path
    newest = _newest_training_checkpoint(path)
    if newest is None:
        raise CheckpointError(
            f"resume_from={path!r} holds no complete training checkpoint taken between batches (no sub-folder "
            f"with a {MANIFEST} of kind 'trainer' written outside an exception); pass a checkpoint folder or the "
            "folder CheckpointCallback writes into."
        )
    return newest[0]


def newest_over_folders(folders: Sequence[str | os.PathLike]) -> str | None:
    """The newest complete training checkpoint (between batches) over all of ``folders``; None if there is none.

    Newest means most batches trained (then latest written), as within one folder; missing folders count as empty.
    """
    found = []
    for parent in folders:
        parent = os.path.abspath(os.fspath(parent))
        newest = _newest_training_checkpoint(parent) if os.path.isdir(parent) else None
        if newest is not None:
            folder, manifest = newest
            found.append((manifest["trainer"].get("global_forward_batches", -1), manifest.get("created", 0), folder))
    return max(found)[2] if found else None


FROZEN_KEY = "frozen"
"""The manifest's record of the frozen parameters a folder does not hold."""


def is_sharded(manifest: Mapping[str, Any]) -> bool:
    """Whether the manifest describes a checkpoint written as one file per rank."""
    return isinstance(manifest.get("sharded"), dict)


def shard_files(manifest: Mapping[str, Any]) -> list[str]:
    """The per-rank files of a sharded checkpoint's manifest (none for a whole-state one)."""
    return list(manifest["sharded"].get("files", [])) if is_sharded(manifest) else []
