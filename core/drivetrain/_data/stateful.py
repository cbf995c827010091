"""Streaming data that reports its position, so a resumed epoch continues from it instead of re-reading.

A dataloader without a sampler the driver can replace (an ``IterableDataset``, a stream) is resumed
mid-epoch by reading and dropping the batches the checkpoint had done: correct, but as slow as those
batches. Where the loader can say where it is, the checkpoint keeps that instead and the resumed
epoch starts there at once:

- a loader with ``state_dict()`` / ``load_state_dict()`` (torchdata's ``StatefulDataLoader``, or any
  loader written to that protocol): its own state;
- a loader over a dataset with that protocol (Hugging Face ``datasets``' streaming
  ``IterableDataset``), read in the main process (``num_workers=0``, so nothing is read ahead of the
  batches trained): the dataset's state.

The state is per process (each rank reads its own part of the stream) and is used only when the
world size is unchanged; otherwise, or for a loader without it, the batches are re-read and the
log says how many.
"""

from __future__ import annotations

from typing import Any


def _has_state(obj: Any) -> bool:
    return callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))


def position_holder(dataloader: Any) -> Any | None:
    """The object whose ``state_dict`` is the loader's position in its data (see the module doc), or None."""
    if _has_state(dataloader):
        return dataloader
    dataset = getattr(dataloader, "dataset", None)
    if dataset is not None and getattr(dataloader, "num_workers", 0) == 0 and _has_state(dataset):
        return dataset
    return None


def loader_position(dataloader: Any) -> Any:
    """The position to save in a checkpoint (None when the loader cannot report one)."""
    holder = position_holder(dataloader)
    return None if holder is None else holder.state_dict()


def restore_loader_position(dataloader: Any, saved: list[Any] | None, rank: int, world_size: int) -> str | None:
    """Put the loader back where this rank's checkpoint left it; returns what was restored (for the log), or None
    when it cannot be (no saved position, another world size, a loader without state)."""
    holder = position_holder(dataloader)
    if holder is None or not saved or len(saved) != world_size or saved[rank] is None:
        return None
    holder.load_state_dict(saved[rank])
    return type(holder).__name__
