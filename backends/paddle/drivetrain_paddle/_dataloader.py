"""Reproducible paddle DataLoaders: the default sampling swapped for a resumable batch sampler.

A resumed run must see the same samples in the same order as the uninterrupted run,
starting right after the last one it consumed. Only the *default* sampling of a plain
``paddle.io.DataLoader`` -- a ``paddle.io.BatchSampler`` over a ``RandomSampler`` or
``SequenceSampler`` of the whole map-style dataset, as ``batch_size=``/``shuffle=``
build it -- is replaced, by a :class:`~drivetrain.ReproducibleBatchSampler` whose order
depends only on (seed, epoch) and which starts mid-epoch in O(1). A custom sampler or
batch sampler encodes the user's intent and is left alone. The new DataLoader copies
every other setting of the user's. The logic is the core's
:class:`~drivetrain.backend.DefaultSampling`; this module says what is paddle's about it.

paddle's ``RandomSampler`` shuffles with numpy's global generator; the seed of the
replacement is drawn once from that generator, so ``np.random.seed`` keeps deciding the
order as it did, and iterating no longer consumes numpy's global random stream.

The legality check catches a paddle crash: worker processes (``num_workers > 0``) over
a dataset whose samples hold paddle tensors end in a segfault, not an error.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import paddle
from paddle.io import BatchSampler, DataLoader, IterableDataset, RandomSampler, SequenceSampler

from drivetrain.backend import DefaultSampling, DriverError


def _settings(dataloader: DataLoader) -> dict[str, Any]:
    """The constructor settings paddle keeps under other names than its arguments'."""
    return {"places": dataloader.places, "persistent_workers": getattr(dataloader, "_persistent_workers", False)}


def _accepts(sampler: Any, batch_sampler: BatchSampler) -> bool:
    """No gradient-accumulation batching, and no generator of the sampler's own (its seed is unknown)."""
    return getattr(batch_sampler, "_acc_steps", 1) == 1 and getattr(sampler, "generator", None) is None


SAMPLING = DefaultSampling(
    loader_name="a paddle.io.DataLoader", loader_type=DataLoader, iterable_dataset=IterableDataset,
    batch_sampler_type=BatchSampler, sequential_sampler=SequenceSampler, random_sampler=RandomSampler,
    draw_seed=lambda sampler, dataloader: int(np.random.randint(2**31)),  # what RandomSampler would draw from
    settings=_settings, accepts=_accepts,
    partial_reason="its sampler draws with replacement, has a generator of its own or covers only part of the "
                   "dataset",
    copied=("feed_list", "return_list", "collate_fn", "num_workers", "use_buffer_reader", "reader_buffer_size",
            "prefetch_factor", "use_shared_memory", "timeout", "worker_init_fn"),
)
reproducible_dataloader = SAMPLING.reproducible
unrepeated_dataloader = SAMPLING.unrepeated
describe_sampling = SAMPLING.describe


def _holds_paddle_tensor(sample: Any, depth: int = 0) -> bool:
    """Whether a sample holds a paddle tensor, looking up to 5 levels into dicts, lists and tuples."""
    if isinstance(sample, paddle.Tensor):
        return True
    if isinstance(sample, Mapping):
        sample = list(sample.values())
    return depth <= 4 and isinstance(sample, (list, tuple)) and any(_holds_paddle_tensor(v, depth + 1) for v in sample)


def check_workers_and_tensors(dataloader: Any, argument: str) -> None:
    """Refuse worker processes of a paddle DataLoader over a dataset that holds paddle tensors (paddle segfaults
    on it)."""
    if getattr(dataloader, "num_workers", 0) <= 0 or isinstance(dataloader.dataset, IterableDataset):
        return
    try:
        first = dataloader.dataset[0] if len(dataloader.dataset) else None
    except Exception:  # noqa: BLE001 - the dataset's own errors surface when it is iterated
        return
    if _holds_paddle_tensor(first):
        raise DriverError(
            f"{argument}: a paddle.io.DataLoader with num_workers={dataloader.num_workers} over a dataset whose "
            f"samples hold paddle tensors ({type(dataloader.dataset).__name__}[0] does); paddle's worker "
            "processes crash on that (a segfault). Keep numpy arrays in the dataset (the DataLoader turns "
            "them into tensors), or use num_workers=0."
        )
