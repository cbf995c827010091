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
(which draws the workers' base seed) leaves the global generators untouched. The logic
is the core's :class:`~drivetrain.backend.DefaultSampling`.
"""

from __future__ import annotations

import inspect
from typing import Any

import oneflow as flow
from oneflow.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler, SequentialSampler

from drivetrain.backend import DefaultSampling

_DEFAULT_GENERATOR = inspect.signature(DataLoader.__init__).parameters["generator"].default
"""The generator every DataLoader shares unless given one (created once, at oneflow's import)."""


def _draw_seed(sampler: Any, dataloader: DataLoader) -> int:
    """The user's generator's seed when they passed one; else a draw from oneflow's global generator."""
    generator = getattr(sampler, "generator", None)
    if generator is None or generator is _DEFAULT_GENERATOR:
        generator = dataloader.generator
    if generator is not None and generator is not _DEFAULT_GENERATOR:
        return int(generator.initial_seed())
    return int(flow.randint(0, 2**62, (1,)).item())


def _seed_generator(generator: Any, seed: int) -> Any:
    generator = flow.Generator("cpu") if generator is None else generator
    generator.manual_seed(seed >> 2)  # 62 bits: a seed oneflow's generator accepts
    return generator


SAMPLING = DefaultSampling(
    loader_name="a oneflow DataLoader", loader_type=DataLoader, iterable_dataset=IterableDataset,
    batch_sampler_type=BatchSampler, sequential_sampler=SequentialSampler, random_sampler=RandomSampler,
    draw_seed=_draw_seed, copied_with_workers=("prefetch_factor",), seed_generator=_seed_generator,
    copied=("num_workers", "collate_fn", "pin_memory", "timeout", "worker_init_fn", "multiprocessing_context"),
    copied_after_build=("persistent_workers",),
)
reproducible_dataloader = SAMPLING.reproducible
unrepeated_dataloader = SAMPLING.unrepeated
describe_sampling = SAMPLING.describe
reseed_for_epoch = SAMPLING.reseed_for_epoch
