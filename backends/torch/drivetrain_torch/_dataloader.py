"""Reproducible torch DataLoaders: the default sampling swapped for a resumable batch sampler.

A resumed run must see the same samples in the same order as the uninterrupted
run, starting right after the last one it consumed. Only the *default* sampling
(a plain ``BatchSampler`` over a ``RandomSampler`` or ``SequentialSampler`` of
the whole dataset) is replaced, by a :class:`ReproducibleBatchSampler` whose order
depends only on (seed, epoch) and which starts mid-epoch in O(1); a custom sampler
encodes the user's intent (weights, buckets, ...) and is left alone. The new
DataLoader copies every other setting of the user's, and has a generator of its own
(the user's, or one made here), so starting an iterator (which draws the workers'
base seed) leaves the global torch RNG -- the one dropout uses -- untouched.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler, SequentialSampler

from drivetrain.backend import ReproducibleBatchSampler, UnrepeatedBatchSampler, find_reproducible_sampler

_OWNS_GENERATOR = "_drivetrain_owns_generator"
"""Attribute set on DataLoaders whose generator this module made (and may therefore reseed)."""
_RANK = "_drivetrain_rank"
"""Attribute holding the process rank mixed into the workers' seeds (distributed loaders only)."""

_COPIED = ("num_workers", "collate_fn", "pin_memory", "timeout", "worker_init_fn", "multiprocessing_context",
           "persistent_workers", "pin_memory_device", "in_order")


def reproducible_dataloader(dataloader: Any, *, num_replicas: int = 1, rank: int = 0, even_batches: bool = False,
                            agree_seed: Callable[[int], int] | None = None) -> Any:
    """A copy of ``dataloader`` with a :class:`ReproducibleBatchSampler`, or ``dataloader`` itself
    when its sampling is not the default one (or it is not a plain DataLoader).

    Distributed (``num_replicas`` > 1): the sampler gives rank ``rank`` its share of every
    global batch. ``agree_seed`` turns the locally drawn seed into the one every process
    uses (a broadcast from rank 0), since processes that shuffle differently would train
    on overlapping shares.
    """
    plan = _default_sampling(dataloader)
    if plan is None:
        return dataloader
    sampler, batch_sampler = plan
    seed = _sampler_seed(sampler, dataloader)
    if agree_seed is not None:
        seed = agree_seed(seed)
    repro = ReproducibleBatchSampler(
        len(dataloader.dataset),
        batch_sampler.batch_size,
        shuffle=isinstance(sampler, RandomSampler),
        drop_last=batch_sampler.drop_last,
        seed=seed,
        num_replicas=num_replicas,
        rank=rank,
        even_batches=even_batches,
    )
    generator = dataloader.generator
    owns = generator is None
    if owns:
        generator = torch.Generator()
        generator.manual_seed(_generator_seed(repro.seed, repro.epoch, rank))
    loader = DataLoader(dataloader.dataset, batch_sampler=repro, generator=generator, **_settings(dataloader))
    setattr(loader, _OWNS_GENERATOR, owns)
    setattr(loader, _RANK, rank)
    return loader


def unrepeated_dataloader(dataloader: Any, *, num_replicas: int, rank: int) -> Any:
    """A copy of ``dataloader`` that reads only rank ``rank``'s contiguous shard, each sample once, or None
    when its sampling is not the default one.

    For evaluation: the shards together are exactly what one process would read (with
    ``drop_last`` the same trailing samples are left out), so metrics reduced across
    processes equal a single-process evaluation. The order inside a shard is the
    dataset's: shuffling does not change a metric.
    """
    plan = _default_sampling(dataloader)
    if plan is None:
        return None
    _, batch_sampler = plan
    size, batch_size = len(dataloader.dataset), batch_sampler.batch_size
    if batch_sampler.drop_last:
        size -= size % batch_size
    shard = UnrepeatedBatchSampler(size, batch_size, num_replicas=num_replicas, rank=rank)
    return DataLoader(dataloader.dataset, batch_sampler=shard, generator=dataloader.generator,
                      **_settings(dataloader))


def _default_sampling(dataloader: Any) -> tuple[Any, BatchSampler] | None:
    """``(sampler, batch_sampler)`` when ``dataloader`` samples a map-style dataset the default way."""
    if type(dataloader) is not DataLoader or isinstance(dataloader.dataset, IterableDataset):
        return None  # a DataLoader subclass may take other constructor arguments: rebuilding it could lose them
    batch_sampler = dataloader.batch_sampler
    if type(batch_sampler) is not BatchSampler:  # also None: batch_size=None disables batching
        return None
    sampler = batch_sampler.sampler
    try:
        size = len(dataloader.dataset)
    except TypeError:
        return None
    if type(sampler) not in (SequentialSampler, RandomSampler) or getattr(sampler, "replacement", False):
        return None
    if sampler.data_source is not dataloader.dataset or len(sampler) != size:
        return None  # a sampler of another dataset, or of part of it (RandomSampler's num_samples)
    return sampler, batch_sampler


def describe_sampling(dataloader: Any) -> str:
    """Why :func:`reproducible_dataloader` cannot replace ``dataloader``'s sampling, in words."""
    if not isinstance(dataloader, DataLoader):
        return f"it is a {type(dataloader).__module__}.{type(dataloader).__qualname__}, not a torch DataLoader"
    if type(dataloader) is not DataLoader:
        return f"it is a DataLoader subclass ({type(dataloader).__qualname__}), which may need other arguments"
    if isinstance(dataloader.dataset, IterableDataset):
        return "its dataset is an IterableDataset, which has no indices to share out"
    batch_sampler = dataloader.batch_sampler
    if batch_sampler is None:
        return "it was built with batch_size=None (no batching)"
    if type(batch_sampler) is not BatchSampler:
        return f"it uses its own batch_sampler ({type(batch_sampler).__qualname__})"
    sampler = batch_sampler.sampler
    if type(sampler) not in (SequentialSampler, RandomSampler):
        return f"it uses its own sampler ({type(sampler).__qualname__})"
    return "its sampler draws with replacement or covers only part of the dataset"


def _sampler_seed(sampler: Any, dataloader: DataLoader) -> int:
    """The user's generator's seed when they gave one; else a draw from torch's global generator.

    torch's own RandomSampler draws its seed from the global generator, so
    ``torch.manual_seed`` keeps deciding the order, as it did before the swap. The
    draw happens once, here, not at every epoch, and a resumed run replaces the
    seed with the checkpoint's.
    """
    generator = getattr(sampler, "generator", None) or dataloader.generator
    if generator is not None:
        return generator.initial_seed()
    return int(torch.empty((), dtype=torch.int64).random_().item())


def _settings(dataloader: DataLoader) -> dict[str, Any]:
    """Every constructor setting of ``dataloader`` except the dataset, the sampling and the generator."""
    settings = {name: getattr(dataloader, name) for name in _COPIED if hasattr(dataloader, name)}
    if dataloader.num_workers > 0:
        settings["prefetch_factor"] = dataloader.prefetch_factor  # torch rejects it without workers
    return settings


def _generator_seed(seed: int, epoch: int, rank: int = 0) -> int:
    """The seed of the loader's own generator for ``epoch``: workers' base seeds depend on (seed, epoch) only,
    and on the rank in distributed training, so that processes do not augment with the same random numbers."""
    entropy = [seed, epoch] if rank == 0 else [seed, epoch, rank]
    return int(np.random.SeedSequence(entropy).generate_state(1, np.uint64)[0])


def reseed_for_epoch(dataloader: Any, epoch: int) -> None:
    """Reseed the generator :func:`reproducible_dataloader` made, so an epoch's worker seeds do not
    depend on how many epochs this process has iterated (a resumed run has iterated fewer).
    A generator the user passed is theirs and is left as it is."""
    if not getattr(dataloader, _OWNS_GENERATOR, False):
        return
    sampler = find_reproducible_sampler(dataloader)
    if sampler is not None:
        dataloader.generator.manual_seed(_generator_seed(sampler.seed, epoch, getattr(dataloader, _RANK, 0)))
