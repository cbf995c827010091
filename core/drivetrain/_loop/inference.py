"""The gradient-free pass over a dataloader that evaluation and prediction share.

Each loop calls the model through a :class:`~drivetrain.backend.ModelStep` (the one training uses too);
:func:`iterate_batches` walks a dataloader with a progress display, :func:`call_with_rng_kept` keeps the
random streams training draws from where they were.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from .._mapping import as_dict
from .._progress import LoopDisplay
from ..backend import Driver


def batch_dict(batch: Any) -> Mapping[str, Any]:
    """A prepared batch as a dict for metrics (a batch that is not a dict contributes nothing by name)."""
    data = as_dict(batch)
    return data if isinstance(data, Mapping) else {}


def loader_total(dataloader: Any, limit: int) -> int | None:
    try:
        total = len(dataloader)
    except TypeError:
        total = None
    if limit != -1:
        total = limit if total is None else min(total, limit)
    return total


def iterate_batches(dataloader: Any, limit: int, display: LoopDisplay, description: str) -> Iterator[Any]:
    """The raw batches of ``dataloader`` (at most ``limit``; -1 = all), advancing ``display``."""
    display.start(description, loader_total(dataloader, limit))
    try:
        for i, batch in enumerate(dataloader):
            if i == limit:
                break
            yield batch
            display.advance()
    finally:
        display.finish()


def call_with_rng_kept(driver: Driver, run: Callable[[], Any]) -> Any:
    """Run ``run()`` without shifting the random streams training draws from (resume stays exact)."""
    from ..backend import capture_host_rng, restore_host_rng

    host_rng, framework_rng = capture_host_rng(), driver.rng_state()
    try:
        return run()
    finally:
        restore_host_rng(host_rng)
        driver.load_rng_state(framework_rng)
