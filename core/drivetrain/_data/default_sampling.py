"""A framework's DataLoader rebuilt around drivetrain's samplers, when it samples the default way.

torch, paddle and oneflow share the shape of their data pipeline: a ``DataLoader`` over
a map-style dataset, iterating a ``BatchSampler`` over a sequential or random sampler
unless the user passed other sampling. A resumed run must see the same samples in the
same order as the uninterrupted run, and a distributed evaluation must read each sample
once; both need the loader rebuilt with one of drivetrain's batch samplers
(:class:`ReproducibleBatchSampler`, :class:`UnrepeatedBatchSampler`). Only the *default*
sampling (a plain batch sampler over a sequential or random sampler of the whole dataset,
without replacement) is replaced: a custom sampler encodes the user's intent (weights,
buckets, ...) and is left alone, and a DataLoader subclass may need other constructor
arguments. :class:`DefaultSampling` holds that logic once; a backend describes its
framework's classes and the few things that differ (how a seed is drawn, which settings
are copied, how a generator is made and seeded).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from .sampler import ReproducibleBatchSampler, UnrepeatedBatchSampler, find_reproducible_sampler

_OWNS_GENERATOR = "_drivetrain_owns_generator"
"""Attribute set on loaders whose generator :class:`DefaultSampling` made (and may therefore reseed)."""
_RANK = "_drivetrain_rank"
"""Attribute holding the process rank mixed into the workers' seeds (distributed loaders only)."""


def _no_settings(loader: Any) -> dict[str, Any]:
    return {}


def _no_generator(loader: Any) -> Any:
    return None


def _accept(sampler: Any, batch_sampler: Any) -> bool:
    return True


def generator_seed(seed: int, epoch: int, rank: int = 0) -> int:
    """A 64-bit seed for a loader's own generator in ``epoch``: it depends on (seed, epoch) only, and on the
    rank in distributed training, so that processes do not augment with the same random numbers."""
    entropy = [seed, epoch] if rank == 0 else [seed, epoch, rank]
    return int(np.random.SeedSequence(entropy).generate_state(1, np.uint64)[0])


@dataclasses.dataclass(frozen=True)
class DefaultSampling:
    """What a framework's default DataLoader sampling looks like, and how to rebuild such a loader.

    The bound methods are what a backend's driver needs: :meth:`reproducible` and
    :meth:`unrepeated` for ``set_dist_repro_dataloader`` (and ``DataSharding``),
    :meth:`describe` for the error when sampling cannot be replaced, and
    :meth:`reseed_for_epoch` for ``set_sampler_epoch``.
    """

    loader_name: str
    """The loader in words, after "not": ``"a torch DataLoader"``."""
    loader_type: type[Any]
    """The framework's DataLoader class (a subclass is never rebuilt)."""
    iterable_dataset: type[Any]
    """The framework's iterable-dataset class (no indices to share out)."""
    batch_sampler_type: type[Any]
    """The framework's plain batch sampler (``sampler``, ``batch_size``, ``drop_last``)."""
    sequential_sampler: type[Any]
    random_sampler: type[Any]
    draw_seed: Callable[[Any, Any], int]
    """``draw_seed(sampler, loader)``: the shuffling seed, from the user's generator or the framework's
    global one (so the framework's own seeding keeps deciding the order), drawn once per rebuild."""
    copied: tuple[str, ...] = ()
    """The loader's attributes passed to the new loader's constructor under the same name (when present)."""
    copied_with_workers: tuple[str, ...] = ()
    """Attributes passed on only when the loader has worker processes (torch refuses ``prefetch_factor``
    without them)."""
    copied_after_build: tuple[str, ...] = ()
    """Flags passed to the constructor as False and set on the built loader afterwards: oneflow's DataLoader
    starts a ``persistent_workers`` loader's iterator in its constructor, before the sampler's epoch or resume
    position is set, and its first ``iter()`` would hand out those batches."""
    settings: Callable[[Any], dict[str, Any]] = _no_settings
    """Further constructor settings of a loader, beyond ``copied`` (e.g. ``prefetch_factor`` only with workers)."""
    accepts: Callable[[Any, Any], bool] = _accept
    """``accepts(sampler, batch_sampler)``: framework-specific conditions for the default sampling."""
    seed_generator: Callable[[Any, int], Any] | None = None
    """``seed_generator(generator_or_None, seed64)`` seeds the generator (a new one for None) and returns it;
    None when the framework's loaders have no generator of their own."""
    users_generator: Callable[[Any], Any] = _no_generator
    """The generator the user gave a loader, kept by the rebuilt loader (and never reseeded), or None."""
    partial_reason: str = "its sampler draws with replacement or covers only part of the dataset"
    """:meth:`describe`'s words for a default-looking sampler that is still not the default sampling."""

    def plan(self, loader: Any) -> tuple[Any, Any] | None:
        """``(sampler, batch_sampler)`` when ``loader`` samples a map-style dataset the default way, else None."""
        if type(loader) is not self.loader_type or isinstance(loader.dataset, self.iterable_dataset):
            return None  # a DataLoader subclass may take other constructor arguments: rebuilding it could lose them
        batch_sampler = loader.batch_sampler
        if type(batch_sampler) is not self.batch_sampler_type:  # also None: batch_size=None disables batching
            return None
        sampler = batch_sampler.sampler
        try:
            size = len(loader.dataset)
        except TypeError:
            return None
        if type(sampler) not in (self.sequential_sampler, self.random_sampler) or getattr(sampler, "replacement", False):
            return None
        if sampler.data_source is not loader.dataset or len(sampler) != size:
            return None  # a sampler of another dataset, or of part of it (a random sampler's num_samples)
        return (sampler, batch_sampler) if self.accepts(sampler, batch_sampler) else None

    def rebuild(self, loader: Any, batch_sampler: Any, generator: Any = None) -> Any:
        """A loader like ``loader`` (dataset, settings) iterating ``batch_sampler``; with ``generator`` when
        the framework's loaders have one (None: the loader's own)."""
        copied = self.copied + (self.copied_with_workers if getattr(loader, "num_workers", 0) > 0 else ())
        settings = {name: getattr(loader, name) for name in copied if hasattr(loader, name)}
        settings.update(self.settings(loader))
        settings.update({name: False for name in self.copied_after_build})
        if self.seed_generator is not None:
            settings["generator"] = loader.generator if generator is None else generator
        rebuilt = self.loader_type(loader.dataset, batch_sampler=batch_sampler, **settings)
        for name in self.copied_after_build:  # no iterator exists yet, so a loader refusing the change (oneflow's
            object.__setattr__(rebuilt, name, getattr(loader, name, False))  # __setattr__) is bypassed safely
        return rebuilt

    def reproducible(self, loader: Any, *, num_replicas: int = 1, rank: int = 0, even_batches: bool = False,
                     agree_seed: Callable[[int], int] | None = None) -> Any:
        """A copy of ``loader`` with a :class:`ReproducibleBatchSampler`, or ``loader`` itself when its
        sampling is not the default one (or it is not a plain DataLoader of the framework).

        Distributed (``num_replicas`` > 1): the sampler gives rank ``rank`` its share of every
        global batch. ``agree_seed`` turns the locally drawn seed into the one every process
        uses (a broadcast from rank 0), since processes that shuffle differently would train
        on overlapping shares. A generator made here (none was the user's) is seeded from
        (seed, epoch, rank), so starting an iterator leaves the framework's global generators
        untouched and :meth:`reseed_for_epoch` can make each epoch's worker seeds resumable.
        """
        plan = self.plan(loader)
        if plan is None:
            return loader
        sampler, batch_sampler = plan
        seed = self.draw_seed(sampler, loader)
        if agree_seed is not None:
            seed = agree_seed(seed)
        repro = ReproducibleBatchSampler(
            len(loader.dataset), batch_sampler.batch_size, shuffle=isinstance(sampler, self.random_sampler),
            drop_last=batch_sampler.drop_last, seed=seed, num_replicas=num_replicas, rank=rank,
            even_batches=even_batches,
        )
        if self.seed_generator is None:
            return self.rebuild(loader, repro)
        generator = self.users_generator(loader)
        owns = generator is None
        if owns:
            generator = self.seed_generator(None, generator_seed(repro.seed, repro.epoch, rank))
        rebuilt = self.rebuild(loader, repro, generator)
        setattr(rebuilt, _OWNS_GENERATOR, owns)
        setattr(rebuilt, _RANK, rank)
        return rebuilt

    def unrepeated(self, loader: Any, *, num_replicas: int, rank: int) -> Any:
        """A copy of ``loader`` that reads only rank ``rank``'s contiguous shard, each sample once, or None
        when its sampling is not the default one.

        For evaluation: the shards together are exactly what one process would read (with
        ``drop_last`` the same trailing samples are left out), so metrics reduced across
        processes equal a single-process evaluation. The order inside a shard is the
        dataset's: shuffling does not change a metric.
        """
        plan = self.plan(loader)
        if plan is None:
            return None
        _, batch_sampler = plan
        size, batch_size = len(loader.dataset), batch_sampler.batch_size
        if batch_sampler.drop_last:
            size -= size % batch_size
        return self.rebuild(loader, UnrepeatedBatchSampler(size, batch_size, num_replicas=num_replicas, rank=rank))

    def describe(self, loader: Any) -> str:
        """Why :meth:`reproducible` cannot replace ``loader``'s sampling, in words."""
        if not isinstance(loader, self.loader_type):
            return f"it is a {type(loader).__module__}.{type(loader).__qualname__}, not {self.loader_name}"
        if type(loader) is not self.loader_type:
            return f"it is a DataLoader subclass ({type(loader).__qualname__}), which may need other arguments"
        if isinstance(loader.dataset, self.iterable_dataset):
            return "its dataset is an IterableDataset, which has no indices to share out"
        batch_sampler = loader.batch_sampler
        if batch_sampler is None:
            return "it was built with batch_size=None (no batching)"
        if type(batch_sampler) is not self.batch_sampler_type:
            return f"it uses its own batch_sampler ({type(batch_sampler).__qualname__})"
        sampler = batch_sampler.sampler
        if type(sampler) not in (self.sequential_sampler, self.random_sampler):
            return f"it uses its own sampler ({type(sampler).__qualname__})"
        return self.partial_reason

    def reseed_for_epoch(self, loader: Any, epoch: int) -> None:
        """Reseed the generator :meth:`reproducible` made, so an epoch's worker seeds do not depend on how
        many epochs this process has iterated (a resumed run has iterated fewer). A generator the user
        passed is theirs and is left as it is."""
        if self.seed_generator is None or not getattr(loader, _OWNS_GENERATOR, False):
            return
        sampler = find_reproducible_sampler(loader)
        if sampler is not None:
            self.seed_generator(loader.generator, generator_seed(sampler.seed, epoch, getattr(loader, _RANK, 0)))
