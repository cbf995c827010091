"""What a model file records about its layout, so a reader in any framework can undo it.

Every manifest (and every exported file's metadata) carries the writer's
:class:`~.layout.WeightLayout` and the class names of the modules that own its tensors: a
paddle folder read where drivetrain-paddle is not installed still says that its Linear
weights are [in, out], and which tensors are Linear weights.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..backend import NEUTRAL, Driver, WeightLayout, decode_classes, get_registry
from .engine import split_name

LAYOUT_KEY = "weight_layout"
CLASSES_KEY = "module_classes"


def format_name(driver: Driver) -> str:
    """The driver name a checkpoint records (shared by drivers of one format, e.g. torch and torch_fsdp)."""
    return driver.checkpoint_format or driver.name


def declared_layout(driver_name: str) -> WeightLayout | None:
    """The weight layout the installed backend of ``driver_name`` declares; None when no such driver is installed."""
    spec = get_registry().specs.get(driver_name)
    return None if spec is None else spec.weight_layout


def layout_record(driver: Driver, names: Iterable[str]) -> dict[str, Any]:
    """The manifest fields describing the layout of the model file of ``driver`` holding tensors ``names``."""
    layout = declared_layout(format_name(driver)) or NEUTRAL
    owners = {split_name(name)[0] for name in names}
    classes = {path: names for path, names in driver.module_classes().items() if path in owners}
    return {LAYOUT_KEY: layout.to_json(), CLASSES_KEY: {path: list(c) for path, c in sorted(classes.items())}}


def recorded_classes(record: Mapping[str, Any]) -> dict[str, tuple[str, ...]] | None:
    """The module classes a manifest or file metadata records; None when it records none."""
    return decode_classes(record.get(CLASSES_KEY)) or None
