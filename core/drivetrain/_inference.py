"""The gradient-free pass over a dataloader that evaluation and prediction share.

One :class:`ModelStep` per loop resolves the function to call, applies
``input_mapping`` to each batch once (so the model, the metrics and the callbacks
see the same mapped batch), names tuple batches by the function's parameters, runs
the function in the driver's precision and applies ``output_mapping`` to what it
returned. :func:`iterate_batches` walks a dataloader with a progress display.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ._driver import Driver
from ._outputs import named_outputs
from ._param_matching import as_dict, make_batch_namer, make_mapping_fn
from ._progress.loop import LoopDisplay


@dataclass(frozen=True)
class ArgumentNames:
    """How the user spells the mapping arguments where this loop was configured (for error messages)."""

    input_mapping: str = "input_mapping"
    output_mapping: str = "output_mapping"


class ModelStep:
    """Map, name and call: one batch in, the mapped outputs out."""

    def __init__(self, driver: Driver, fn_name: str | Callable | None, default: str, input_mapping: Any,
                 output_mapping: Any, names: ArgumentNames, what: str) -> None:
        self.driver = driver
        self.names = names
        self.what = what
        if callable(fn_name):  # a function of the batch's values instead of a method of the model
            self.fn = self.signature_fn = fn_name
        else:
            self.fn, self.signature_fn = driver.get_model_call_fn(fn_name, default=default)
        self.input_fn = make_mapping_fn(input_mapping, names.input_mapping)
        self.output_fn = make_mapping_fn(output_mapping, names.output_mapping,
                                         to_dict=lambda outputs: named_outputs(outputs, what))
        self.namer = make_batch_namer(self.signature_fn, driver.model_wo_auto_param_call)

    def prepare(self, batch: Any) -> Any:
        """Move ``batch`` to the device, apply the input mapping and name a tuple batch."""
        batch = self.driver.move_data_to_device(batch)
        if self.input_fn is not None:
            batch = self.input_fn(batch)
        if self.namer is not None:
            batch = self.namer(batch)
        return batch

    def call(self, batch: Any) -> Any:
        """Run the function on a prepared batch in the driver's precision; return the mapped outputs."""
        driver = self.driver
        context = driver.auto_cast()
        if type(context) is contextlib.nullcontext:
            outputs = driver.model_call(batch, self.fn, self.signature_fn)
        else:
            with context:
                outputs = driver.model_call(batch, self.fn, self.signature_fn)
        if self.output_fn is not None:
            outputs = self.output_fn(outputs)
        return outputs


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
    from ._seed import capture_host_rng, restore_host_rng

    host_rng, framework_rng = capture_host_rng(), driver.rng_state()
    try:
        return run()
    finally:
        restore_host_rng(host_rng)
        driver.load_rng_state(framework_rng)
