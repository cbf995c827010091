"""Reproducible paddle DataLoaders: the default sampling swapped for a resumable batch sampler.

A resumed run must see the same samples in the same order as the uninterrupted run,
starting right after the last one it consumed. Only the *default* sampling of a plain
``paddle.io.DataLoader`` -- a ``paddle.io.BatchSampler`` over a ``RandomSampler`` or
``SequenceSampler`` of the whole map-style dataset, as ``batch_size=``/``shuffle=``
build it -- is replaced, by a :class:`~drivetrain.ReproducibleBatchSampler` whose order
depends only on (seed, epoch) and which starts mid-epoch in O(1). A custom sampler or
batch sampler encodes the user's intent and is left alone. The new DataLoader copies
every other setting of the user's.

paddle's ``RandomSampler`` shuffles with numpy's global generator; the seed of the
replacement is drawn once from that generator, so ``np.random.seed`` keeps deciding the
order as it did, and iterating no longer consumes numpy's global random stream.

The legality check catches a paddle crash: worker processes (``num_workers > 0``) over
a dataset whose samples hold paddle tensors end in a segfault, not an error.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import paddle
from paddle.io import BatchSampler, DataLoader, IterableDataset, RandomSampler, SequenceSampler

from drivetrain.backend import DriverError, ReproducibleBatchSampler, UnrepeatedBatchSampler

_COPIED = ("feed_list", "return_list", "collate_fn", "num_workers", "use_buffer_reader", "reader_buffer_size",
           "prefetch_factor", "use_shared_memory", "timeout", "worker_init_fn")


def reproducible_dataloader(dataloader: Any, *, num_replicas: int = 1, rank: int = 0, even_batches: bool = False,
                            agree_seed: Callable[[int], int] | None = None) -> Any:
    """A copy of ``dataloader`` with a :class:`ReproducibleBatchSampler`, or ``dataloader`` itself
    when its sampling is not the default one (or it is not a plain paddle DataLoader).

    Distributed (``num_replicas`` > 1): the sampler gives rank ``rank`` its share of every
    global batch. ``agree_seed`` turns the locally drawn seed into the one every process
    uses (a broadcast from rank 0), since processes that shuffle differently would train
    on overlapping shares.
    """
    batch_sampler = _default_batch_sampler(dataloader)
    if batch_sampler is None:
        return dataloader
    seed = int(np.random.randint(2**31))  # what paddle's RandomSampler would have drawn from
    if agree_seed is not None:
        seed = agree_seed(seed)
    repro = ReproducibleBatchSampler(
        len(dataloader.dataset),
        batch_sampler.batch_size,
        shuffle=isinstance(batch_sampler.sampler, RandomSampler),
        drop_last=batch_sampler.drop_last,
        seed=seed,
        num_replicas=num_replicas,
        rank=rank,
        even_batches=even_batches,
    )
    return DataLoader(dataloader.dataset, batch_sampler=repro, **_settings(dataloader))


def unrepeated_dataloader(dataloader: Any, *, num_replicas: int, rank: int) -> Any:
    """A copy of ``dataloader`` that reads only rank ``rank``'s contiguous shard, each sample once, or None
    when its sampling is not the default one.

    For evaluation: the shards together are exactly what one process reads (with
    ``drop_last`` the same trailing samples are left out), so metrics reduced across
    processes equal a single-process evaluation; shuffling does not change a metric.
    """
    batch_sampler = _default_batch_sampler(dataloader)
    if batch_sampler is None:
        return None
    size, batch_size = len(dataloader.dataset), batch_sampler.batch_size
    if batch_sampler.drop_last:
        size -= size % batch_size
    shard = UnrepeatedBatchSampler(size, batch_size, num_replicas=num_replicas, rank=rank)
    return DataLoader(dataloader.dataset, batch_sampler=shard, **_settings(dataloader))


def describe_sampling(dataloader: Any) -> str:
    """Why the sampling of ``dataloader`` cannot be replaced, in words."""
    if not isinstance(dataloader, DataLoader):
        return f"it is a {type(dataloader).__module__}.{type(dataloader).__qualname__}, not a paddle.io.DataLoader"
    if type(dataloader) is not DataLoader:
        return f"it is a DataLoader subclass ({type(dataloader).__qualname__}), which may need other arguments"
    if isinstance(dataloader.dataset, IterableDataset):
        return "its dataset is an IterableDataset, which has no indices to share out"
    batch_sampler = dataloader.batch_sampler
    if batch_sampler is None:
        return "it was built with batch_size=None (no batching)"
    if type(batch_sampler) is not BatchSampler:
        return f"it uses its own batch_sampler ({type(batch_sampler).__qualname__})"
    return f"it uses its own sampler ({type(batch_sampler.sampler).__qualname__}) or one over part of the dataset"


def _default_batch_sampler(dataloader: Any) -> BatchSampler | None:
    """The DataLoader's ``BatchSampler`` when it samples a map-style dataset the default way."""
    if type(dataloader) is not DataLoader or isinstance(dataloader.dataset, IterableDataset):
        return None  # a subclass may take other constructor arguments: rebuilding it could lose them
    batch_sampler = dataloader.batch_sampler
    if type(batch_sampler) is not BatchSampler or getattr(batch_sampler, "_acc_steps", 1) != 1:
        return None  # also None: batch_size=None disables batching; DistributedBatchSampler is a subclass
    sampler = batch_sampler.sampler
    try:
        size = len(dataloader.dataset)
    except TypeError:
        return None
    if type(sampler) is SequenceSampler:
        return batch_sampler if sampler.data_source is dataloader.dataset else None
    if type(sampler) is not RandomSampler or sampler.replacement or sampler.generator is not None:
        return None
    if sampler.data_source is not dataloader.dataset or sampler.num_samples != size:
        return None  # a sampler of another dataset, or of part of it
    return batch_sampler


def _settings(dataloader: DataLoader) -> dict[str, Any]:
    """Every constructor setting of ``dataloader`` except the dataset and the sampling."""
    settings = {name: getattr(dataloader, name) for name in _COPIED if hasattr(dataloader, name)}
    settings["places"] = dataloader.places
    settings["persistent_workers"] = getattr(dataloader, "_persistent_workers", False)
    return settings


def _holds_paddle_tensor(sample: Any, depth: int = 0) -> bool:
    if isinstance(sample, paddle.Tensor):
        return True
    if depth > 4:
        return False
    if isinstance(sample, Mapping):
        return any(_holds_paddle_tensor(v, depth + 1) for v in sample.values())
    if isinstance(sample, (list, tuple)):
        return any(_holds_paddle_tensor(v, depth + 1) for v in sample)
    return False


def check_workers_and_tensors(dataloader: Any, argument: str) -> None:
    """Refuse worker processes over a dataset that holds paddle tensors (paddle segfaults on it)."""
    if type(dataloader) is not DataLoader and not isinstance(dataloader, DataLoader):
        return
    if getattr(dataloader, "num_workers", 0) <= 0 or isinstance(dataloader.dataset, IterableDataset):
        return
    try:
        if len(dataloader.dataset) == 0:
            return
        first = dataloader.dataset[0]
    except Exception:  # noqa: BLE001 - the dataset's own errors surface when it is iterated
        return
    if _holds_paddle_tensor(first):
        raise DriverError(
            f"{argument}: a paddle.io.DataLoader with num_workers={dataloader.num_workers} over a dataset whose "
            f"samples hold paddle tensors ({type(dataloader.dataset).__name__}[0] does); paddle's worker "
            "processes crash on that (a segfault). Keep numpy arrays in the dataset (the DataLoader turns "
            "them into tensors), or use num_workers=0."
        )
