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
The logic is the core's :class:`~drivetrain.backend.DefaultSampling`; this module
says what is torch's about it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler, SequentialSampler

from drivetrain.backend import DefaultSampling


def _draw_seed(sampler: Any, dataloader: DataLoader) -> int:
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


def _seed_generator(generator: torch.Generator | None, seed: int) -> torch.Generator:
    generator = torch.Generator() if generator is None else generator
    generator.manual_seed(seed)
    return generator


SAMPLING = DefaultSampling(
    loader_name="a torch DataLoader", loader_type=DataLoader, iterable_dataset=IterableDataset,
    batch_sampler_type=BatchSampler, sequential_sampler=SequentialSampler, random_sampler=RandomSampler,
    draw_seed=_draw_seed, copied_with_workers=("prefetch_factor",), seed_generator=_seed_generator,
    users_generator=lambda dataloader: dataloader.generator,
    copied=("num_workers", "collate_fn", "pin_memory", "timeout", "worker_init_fn", "multiprocessing_context",
            "persistent_workers", "pin_memory_device", "in_order"),
)
reproducible_dataloader = SAMPLING.reproducible
unrepeated_dataloader = SAMPLING.unrepeated
describe_sampling = SAMPLING.describe
reseed_for_epoch = SAMPLING.reseed_for_epoch
