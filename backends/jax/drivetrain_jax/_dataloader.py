"""Resumable, shardable training data for the jax driver.

Two loaders can have their order replaced by drivetrain's samplers: :class:`drivetrain_jax.DataLoader`, and a torch
``DataLoader`` with default sampling (the JAX documentation's recipe, with a numpy collate), through the core's
:class:`~drivetrain.backend.DefaultSampling` with torch's classes, imported only when such a loader is given.
Any other iterable of batches (a list, a generator) is used as it is.
"""

from __future__ import annotations

import functools
import random
import sys
from typing import Any

from drivetrain.backend import DefaultSampling, ReproducibleBatchSampler, UnrepeatedBatchSampler

from .data import DataLoader


@functools.cache
def _torch_sampling() -> DefaultSampling:
    import torch
    from torch.utils.data import BatchSampler, IterableDataset, RandomSampler, SequentialSampler

    def draw_seed(sampler: Any, loader: Any) -> int:  # Python's random, which seed_everything seeds
        generator = getattr(sampler, "generator", None) or loader.generator
        return generator.initial_seed() if generator is not None else random.randrange(2**31)

    def seed_generator(generator: Any, seed: int) -> Any:
        generator = torch.Generator() if generator is None else generator
        generator.manual_seed(seed)
        return generator

    return DefaultSampling(
        loader_name="a torch DataLoader", loader_type=torch.utils.data.DataLoader, iterable_dataset=IterableDataset,
        batch_sampler_type=BatchSampler, sequential_sampler=SequentialSampler, random_sampler=RandomSampler,
        draw_seed=draw_seed, copied_with_workers=("prefetch_factor",), seed_generator=seed_generator,
        users_generator=lambda loader: loader.generator,
        copied=("num_workers", "collate_fn", "pin_memory", "timeout", "worker_init_fn", "multiprocessing_context",
                "persistent_workers", "in_order"))


def _torch(loader: Any) -> DefaultSampling | None:
    """torch's sampling rules when ``loader`` is a torch DataLoader (or a subclass), else None; imports nothing."""
    if "torch" not in sys.modules:
        return None
    is_torch = any(cls.__module__.startswith("torch.utils.data") for cls in type(loader).__mro__)
    return _torch_sampling() if is_torch else None


def reproducible(loader: Any, *, num_replicas: int = 1, rank: int = 0, even_batches: bool = False,
                 agree_seed: Any = None) -> Any:
    """``loader`` with a :class:`ReproducibleBatchSampler`, or itself when its order cannot be replaced."""
    if isinstance(loader, DataLoader):
        if loader.batch_sampler is not None:
            return loader
        seed = loader.seed if agree_seed is None else agree_seed(loader.seed)
        return loader.with_batch_sampler(ReproducibleBatchSampler(
            len(loader.dataset), loader.batch_size, shuffle=loader.shuffle, drop_last=loader.drop_last, seed=seed,
            num_replicas=num_replicas, rank=rank, even_batches=even_batches))
    sampling = _torch(loader)
    if sampling is None:
        return loader
    return sampling.reproducible(loader, num_replicas=num_replicas, rank=rank, even_batches=even_batches,
                                 agree_seed=agree_seed)


def unrepeated(loader: Any, *, num_replicas: int, rank: int) -> Any:
    """This rank's contiguous evaluation shard of ``loader``, or None when its order cannot be replaced."""
    if isinstance(loader, DataLoader):
        if loader.batch_sampler is not None:
            return None
        size = len(loader.dataset) - (len(loader.dataset) % loader.batch_size if loader.drop_last else 0)
        return loader.with_batch_sampler(UnrepeatedBatchSampler(size, loader.batch_size, num_replicas=num_replicas,
                                                                 rank=rank))
    sampling = _torch(loader)
    return None if sampling is None else sampling.unrepeated(loader, num_replicas=num_replicas, rank=rank)


def describe(loader: Any) -> str:
    """Why ``loader``'s order cannot be replaced, in words."""
    if isinstance(loader, DataLoader):
        return "it was given its own batch_sampler"
    sampling = _torch(loader)
    if sampling is not None:
        return sampling.describe(loader)
    return (f"it is a {type(loader).__module__}.{type(loader).__qualname__}, not a drivetrain_jax.DataLoader or a "
            "torch DataLoader")


def reseed_for_epoch(loader: Any, epoch: int) -> None:
    """A torch loader's own generator reseeded for ``epoch`` (its workers' seeds then resume exactly)."""
    sampling = _torch(loader)
    if sampling is not None:
        sampling.reseed_for_epoch(loader, epoch)
