"""The ``create_driver`` a plugin points at, written once for every :class:`ModuleDriver` backend.

Every backend's factory did the same: check the model and the shape of ``<name>_kwargs``,
ask whether this run is distributed (a launcher's environment, ``nproc``, a device
list), build that driver or the single-process one on the first listed device. Only
the distributed question is the backend's own: it passes it as ``distributed``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

from .._common import DriverError
from ._driver import Driver
from ._module_driver import ModuleDriver

DistributedChoice = Callable[[Any, Any, "int | None", dict[str, Any]], "Driver | None"]
"""``distributed(model, device, nproc, options) -> Driver | None``: the distributed driver, or None for one process.

``options`` holds the driver options (``precision``, ``grad_clip``, ``grad_clip_type``,
``model_wo_auto_param_call``, ``framework_kwargs``) to pass on; raise a DriverError
for a layout the backend cannot run (with the command that would run it).
"""


def _imported(target: str) -> Any:
    """The object a ``"module:attribute"`` string names, its module imported now."""
    module, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module), attribute)


def planned_distributed(plan: str | Callable[..., Any], driver: str) -> DistributedChoice:
    """A ``distributed`` choice for :func:`module_driver_factory` from a planner and a driver class.

    ``plan(model, device, nproc, framework_kwargs)`` (or the ``"module:function"`` naming it,
    imported only when a driver is built) returns the distributed run's plan, or None for one
    process; ``driver`` (``"module:Class"``, imported only when a plan comes back) is built as
    ``Class(model, plan, **options)``. Lazy imports keep the distributed modules out of
    single-process runs.
    """

    def distributed(model: Any, device: Any, nproc: int | None, options: dict[str, Any]) -> Driver | None:
        planner = _imported(plan) if isinstance(plan, str) else plan
        layout = planner(model, device, nproc, options["framework_kwargs"] or {})
        if layout is None:
            return None
        return _imported(driver)(model, layout, **options)

    return distributed


def module_driver_factory(single: type[ModuleDriver],
                          distributed: DistributedChoice | None = None) -> Callable[..., Driver]:
    """A factory building ``distributed(...)``'s driver when it returns one, else ``single`` on one device."""

    def create_driver(model: Any, device: Any, *, nproc: int | None = None, precision: str = "fp32",
                      grad_clip: float | None = None, grad_clip_type: str = "norm",
                      model_wo_auto_param_call: bool = False,
                      framework_kwargs: Any = None) -> Driver:
        single.check_model(model)
        if framework_kwargs is not None and not isinstance(framework_kwargs, Mapping):
            single.check_options(framework_kwargs)  # raises, naming the argument
        options: dict[str, Any] = dict(precision=precision, grad_clip=grad_clip, grad_clip_type=grad_clip_type,
                                       model_wo_auto_param_call=model_wo_auto_param_call,
                                       framework_kwargs=framework_kwargs)
        if distributed is not None:
            driver = distributed(model, device, nproc, options)
            if driver is not None:
                return driver
        if nproc is not None and nproc > 1:
            raise DriverError(f"nproc={nproc}: the {single.name} backend cannot train with several processes here; "
                              "pass nproc=1 or leave it out.")
        if isinstance(device, (list, tuple)):
            if not device:
                raise DriverError(f"device=[] lists no device; pass one, e.g. 'cpu', to the {single.name} driver.")
            device = device[0]
        return single(model, device, **options)

    create_driver.__doc__ = (
        f"Build the {single.name} driver for ``model`` on ``device``: the distributed one when the launch "
        f"asks for several processes, else :class:`{single.__qualname__}` on the first listed device."
    )
    return create_driver
