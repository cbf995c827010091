"""Reproducible oneflow DataLoaders: the default sampling swapped for a resumable batch sampler.

oneflow's ``DataLoader`` mirrors torch's, with one difference that matters here: its
default ``generator`` is a single ``oneflow.Generator`` created when oneflow is imported
and shared by every DataLoader, seeded with a fixed constant; ``oneflow.manual_seed``
does not reach it. Only the *default* sampling (a plain ``BatchSampler`` over a
``RandomSampler`` or ``SequentialSampler`` of the whole dataset) is replaced, by the
core's :class:`ReproducibleBatchSampler`, whose order depends only on (seed, epoch)
and which starts mid-epoch in O(1). The seed is the generator's when the user passed
one, else a draw from oneflow's global generator (so ``seed_everything`` decides the
order). A custom sampler encodes the user's intent and is left alone. The new loader
copies every other setting and gets a generator of its own, so starting an iterator
(which draws the workers' base seed) leaves the global generators untouched.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import numpy as np
import oneflow as flow
from oneflow.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler, SequentialSampler

from drivetrain.backend import ReproducibleBatchSampler, UnrepeatedBatchSampler, find_reproducible_sampler

_DEFAULT_GENERATOR = inspect.signature(DataLoader.__init__).parameters["generator"].default
"""The generator every DataLoader shares unless given one (created once, at oneflow's import)."""
_OWNS_GENERATOR = "_drivetrain_owns_generator"
_RANK = "_drivetrain_rank"
_COPIED = ("num_workers", "collate_fn", "pin_memory", "timeout", "worker_init_fn", "multiprocessing_context",
           "persistent_workers")


def reproducible_dataloader(dataloader: Any, *, num_replicas: int = 1, rank: int = 0, even_batches: bool = False,
                            agree_seed: Callable[[int], int] | None = None) -> Any:
    """A copy of ``dataloader`` with a :class:`ReproducibleBatchSampler`, or ``dataloader`` itself
    when its sampling is not the default one (or it is not a plain oneflow DataLoader).

    Distributed (``num_replicas`` > 1): rank ``rank`` gets its share of every global batch;
    ``agree_seed`` turns the locally drawn seed into the one every process uses.
    """
    plan = _default_sampling(dataloader)
    if plan is None:
        return dataloader
    sampler, batch_sampler = plan
    seed = _sampler_seed(sampler, dataloader)
    if agree_seed is not None:
        seed = agree_seed(seed)
    repro = ReproducibleBatchSampler(
        len(dataloader.dataset), batch_sampler.batch_size, shuffle=isinstance(sampler, RandomSampler),
        drop_last=batch_sampler.drop_last, seed=seed, num_replicas=num_replicas, rank=rank,
        even_batches=even_batches,
    )
    generator = flow.Generator("cpu")
    generator.manual_seed(_generator_seed(repro.seed, repro.epoch, rank))
    loader = DataLoader(dataloader.dataset, batch_sampler=repro, generator=generator, **_settings(dataloader))
    setattr(loader, _OWNS_GENERATOR, True)
    setattr(loader, _RANK, rank)
    return loader


def unrepeated_dataloader(dataloader: Any, *, num_replicas: int, rank: int) -> Any:
    """A copy of ``dataloader`` reading only rank ``rank``'s contiguous shard, each sample once, or None
    when its sampling is not the default one (evaluation: the shards together are the dataset)."""
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


def _default_sampling(dataloader: Any) -> tuple[Any, Any] | None:
    """``(sampler, batch_sampler)`` when ``dataloader`` samples a map-style dataset the default way."""
    if type(dataloader) is not DataLoader or isinstance(dataloader.dataset, IterableDataset):
        return None
    batch_sampler = dataloader.batch_sampler
    if type(batch_sampler) is not BatchSampler:
        return None
    sampler = batch_sampler.sampler
    try:
        size = len(dataloader.dataset)
    except TypeError:
        return None
    if type(sampler) not in (SequentialSampler, RandomSampler) or getattr(sampler, "replacement", False):
        return None
    if sampler.data_source is not dataloader.dataset or len(sampler) != size:
        return None
    return sampler, batch_sampler


def describe_sampling(dataloader: Any) -> str:
    """Why :func:`reproducible_dataloader` cannot replace ``dataloader``'s sampling, in words."""
    if not isinstance(dataloader, DataLoader):
        return f"it is a {type(dataloader).__module__}.{type(dataloader).__qualname__}, not a oneflow DataLoader"
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
    """The user's generator's seed when they passed one; else a draw from oneflow's global generator."""
    generator = getattr(sampler, "generator", None)
    if generator is None or generator is _DEFAULT_GENERATOR:
        generator = dataloader.generator
    if generator is not None and generator is not _DEFAULT_GENERATOR:
        return int(generator.initial_seed())
    return int(flow.randint(0, 2**62, (1,)).item())


def _settings(dataloader: DataLoader) -> dict[str, Any]:
    settings = {name: getattr(dataloader, name) for name in _COPIED if hasattr(dataloader, name)}
    if dataloader.num_workers > 0:
        settings["prefetch_factor"] = dataloader.prefetch_factor
    return settings


def _generator_seed(seed: int, epoch: int, rank: int = 0) -> int:
    """The seed of the loader's own generator for ``epoch`` (workers' base seeds depend on it)."""
    entropy = [seed, epoch] if rank == 0 else [seed, epoch, rank]
    return int(np.random.SeedSequence(entropy).generate_state(1, np.uint64)[0]) >> 2


def reseed_for_epoch(dataloader: Any, epoch: int) -> None:
    """Reseed the generator :func:`reproducible_dataloader` made, so an epoch's worker seeds do not depend
    on how many epochs this process has iterated (a resumed run has iterated fewer)."""
    if not getattr(dataloader, _OWNS_GENERATOR, False):
        return
    sampler = find_reproducible_sampler(dataloader)
    if sampler is not None:
        dataloader.generator.manual_seed(_generator_seed(sampler.seed, epoch, getattr(dataloader, _RANK, 0)))
