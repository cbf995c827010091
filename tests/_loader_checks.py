"""The framework-free halves of the DataLoader worker tests of each backend (tests/<backend>/test_*_loader_*.py).

Each backend's test builds its framework's loader, dataset and recording model; what the
tests then assert about the batches the model saw is the same for every framework and lives here.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from drivetrain.backend import find_reproducible_sampler

N = 48
BATCH = 8


def features() -> np.ndarray:
    """The samples' inputs, the same in every framework's test."""
    return np.random.default_rng(0).standard_normal((N, 4)).astype(np.float32)


def record(seen: list[dict[str, Any]], index: list[int], pid: list[int], initialised: list[int],
           collated: Any) -> None:
    """What a recording model keeps of one batch: the sample indices, the reading processes and flags."""
    seen.append({"index": index, "pid": set(pid), "initialised": set(initialised), "collated": collated is not None})


def per_epoch(seen: list[dict[str, Any]], key: str) -> list[list[Any]]:
    """``key`` of every batch of each of the two epochs, concatenated per epoch."""
    batches = len(seen) // 2
    return [sum((list(b[key]) for b in seen[e * batches:(e + 1) * batches]), []) for e in range(2)]


def check_settings_kept(loader: Any, rebuilt: Any, names: tuple[str, ...]) -> None:
    """The rebuilt loader carries each of ``names`` over from the user's loader."""
    for name in names:
        assert getattr(rebuilt, name) is getattr(loader, name) or getattr(rebuilt, name) == getattr(loader, name), name


def check_persistent_workers_read_each_sample_once(seen: list[dict[str, Any]]) -> set[int]:
    """Two worker processes served both epochs, each epoch read every sample once, reshuffled; returns their pids."""
    pids = per_epoch(seen, "pid")
    assert 0 not in pids[0] and len(set(pids[0])) == 2
    assert set(pids[0]) == set(pids[1])  # the same two worker processes served both epochs
    indices = per_epoch(seen, "index")
    assert all(sorted(epoch) == list(range(N)) for epoch in indices)
    assert indices[0] != indices[1]  # reshuffled for the second epoch
    return set(pids[0])


def check_left_alone(trainer: Any, loader: Any, seen: list[dict[str, Any]]) -> None:
    """A loader with the user's own sampler is iterated as given, by persistent workers."""
    assert trainer.dataloader is loader
    assert find_reproducible_sampler(trainer.dataloader) is None
    assert trainer.global_forward_batches == 2 * (N // BATCH)
    pids = per_epoch(seen, "pid")
    assert set(pids[0]) == set(pids[1]) and 0 not in pids[0]
