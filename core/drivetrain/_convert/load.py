"""Loading a model file of another framework into a model, and converting one with no model at hand.

Both read the source without a framework (:mod:`.source`), bring it into the neutral layout
with the rules it records, then into the target's with the rules the target's backend declares
(:mod:`.engine`). Everything is matched (names, shapes) before a single tensor is copied.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from .._common import ConfigurationError, __version__, close_matches
from .._format import CheckpointError, safetensors_writer, write_checkpoint
from ..backend import NEUTRAL, Driver, WeightLayout, driver_not_found, get_registry
from .engine import NameMap, Tensor, check_name_map, companions, from_neutral, rename, split_name, to_neutral
from .record import CLASSES_KEY, LAYOUT_KEY, declared_layout, format_name
from .source import MODEL_FILE, SourceWeights, open_source


def load_converted(driver: Driver, path: str, name_map: NameMap = None, source_driver: str | None = None) -> None:
    """Load the model file ``path``, written by another framework's driver (``source_driver`` for a file that does
    not say), into ``driver``'s model."""
    check_name_map(name_map)
    if driver.shards_state:
        raise CheckpointError(f"{path} was written by another framework; driver {driver.name!r} shards its model, "
                              "so load it into the framework's single-process driver first and save it there.")
    source = open_source(path, source_driver)
    try:
        current = {name: tuple(tensor.shape) for name, tensor in driver.model_state().items()}
        converted = _converted_for(driver, source, current, name_map)
        _check_matches(converted, current, source, driver.name, name_map)
        entries = [(name, t.dtype, t.shape, t.data) for name, t in converted.items()]
        tensors = driver.tensors_from_bytes(safetensors_writer.encode(entries))
    finally:
        source.close()
    driver.load_model_state(tensors)


def _converted_for(driver: Driver, source: SourceWeights, current: Mapping[str, tuple[int, ...]],
                   name_map: NameMap) -> dict[str, Tensor]:
    """The source's tensors in the layout of ``driver``, module classes read from its model."""
    mine = driver.module_classes()
    target_layout = declared_layout(format_name(driver)) or NEUTRAL

    def target_classes(path: str) -> tuple[str, ...] | None:
        return mine.get(path, ()) if mine else None

    def source_classes(path: str) -> tuple[str, ...] | None:
        if source.classes is not None:
            return source.classes.get(path, ())
        return target_classes(_module_path(path, name_map))

    neutral = to_neutral(source.tensors, source.layout, source_classes, name_map)
    converted = from_neutral(neutral, target_layout, target_classes)
    filled = companions(neutral, source.layout, target_layout)
    converted.update({name: t for name, t in filled.items() if name in current and name not in converted})
    return converted


def _check_matches(converted: Mapping[str, Tensor], current: Mapping[str, tuple[int, ...]], source: SourceWeights,
                   target: str, name_map: NameMap) -> None:
    """Refuse, before anything is copied, tensors without a place, places without a tensor, and shapes that differ."""
    extra = sorted(set(converted) - set(current))
    missing = sorted(set(current) - set(converted))
    head = (f"{source.where} (written by driver {source.driver!r}) does not fit this {target} model after both "
            "frameworks' layout rules; nothing was loaded.")
    if extra or missing:
        lines = [f"  in the file, not in the model: {_named(name, converted[name].stored_as)}"
                 f"{_guess(name, missing)}" for name in extra[:10]]
        lines += [f"  ... and {len(extra) - 10} more in the file"] if len(extra) > 10 else []
        lines += [f"  in the model, not in the file: {name!r}" for name in missing[:10]]
        lines += [f"  ... and {len(missing) - 10} more in the model"] if len(missing) > 10 else []
        fix = _name_map_hint(extra, missing) if name_map is None else "Check name_map: it gave the names above."
        raise CheckpointError("\n".join([head, *lines]) + f"\n{fix}")
    wrong = [(name, converted[name], current[name]) for name in current if converted[name].shape != current[name]]
    if wrong:
        lines = [f"  {_named(name, t.stored_as)}: file {list(t.shape)}, model {list(shape)}"
                 + ("  (the transpose: is its module a Linear in one framework only?)"
                    if len(shape) == 2 and t.shape == shape[::-1] else "") for name, t, shape in wrong[:10]]
        raise CheckpointError("\n".join([head, "  shapes differ:", *lines]) + "\nBuild the model with the same "
                              "layer sizes as the one that wrote the file.")


def _named(name: str, stored_as: str) -> str:
    return repr(name) if stored_as == name else f"{name!r} (stored as {stored_as!r})"


def _guess(name: str, candidates: list[str]) -> str:
    close = close_matches(name, candidates)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _name_map_hint(extra: list[str], missing: list[str]) -> str:
    """How to pass ``name_map``, with the first pair of close names as the example when there is one."""
    for name in extra:
        close = close_matches(name, missing)
        if close:
            old, new = split_name(name)[0], split_name(close[0])[0]
            if old and new and old != new:
                return (f"Modules named differently? Pass name_map={{{old!r}: {new!r}}} (module path or tensor name in "
                        "the file -> in the model), or a function of the tensor name.")
    return ("Build the same architecture under the same attribute names, or pass name_map= (a dict of module path "
            "or tensor name in the file -> in the model, or a function of the tensor name) for renamed modules.")


def convert_weights(source: str | os.PathLike, to: str, out: str | os.PathLike, *, name_map: NameMap = None,
                    source_driver: str | None = None) -> str:
    """Write the model folder or exported file ``source`` as a model folder of driver ``to`` at ``out``; return it.

    No model is needed when the rules need none, or when the source records its module classes
    (every drivetrain folder does): ``drivetrain convert FOLDER --to paddle -o OUT`` on the command
    line. The folder is written atomically; ``trainer.load_model(out)`` in framework ``to`` reads it.

    Args:
        source: a model folder, a file written by ``drivetrain export``, or a plain ``.safetensors`` file
            (with ``source_driver``).
        to: the target driver's name (``"paddle"``).
        out: the folder to write.
        name_map: renames from the source's names to the target's: a dict or a function of the name.
        source_driver: the driver whose layout a file without drivetrain's metadata is in (``"torch"`` for a
            Hugging Face ``model.safetensors``).

    Returns:
        The folder written.

    Raises:
        CheckpointError: the source cannot be read or its tensors cannot be moved (unmatched names, rules
            that need module classes it does not record).
        DriverNotFoundError: ``to`` names no installed driver.
    """
    check_name_map(name_map)
    spec = get_registry().specs.get(to) if isinstance(to, str) else None
    if spec is None:
        raise driver_not_found(str(to)) if isinstance(to, str) else ConfigurationError(
            f"to={to!r} must be a driver name such as 'paddle'.")
    opened = open_source(os.fspath(source), source_driver)
    try:
        tensors, classes = _converted_for_folder(opened, to, spec.weight_layout, name_map)
        entries = [(name, t.dtype, t.shape, t.data) for name, t in tensors.items()]
        manifest: dict[str, Any] = {
            "drivetrain_version": __version__, "driver": to, "kind": "model", "pickle": False,
            "framework_version": f"converted from {opened.driver} by drivetrain",
            LAYOUT_KEY: spec.weight_layout.to_json(), CLASSES_KEY: {p: list(c) for p, c in classes.items()}}
        return write_checkpoint(os.fspath(out), {MODEL_FILE: entries}, manifest)
    finally:
        opened.close()


def _converted_for_folder(source: SourceWeights, to: str, layout: WeightLayout,
                          name_map: NameMap) -> tuple[dict[str, Tensor], dict[str, tuple[str, ...]]]:
    """The source's tensors in ``layout`` and its module classes under the new names; the target's module-scoped
    rules read the classes the source recorded (the layers' class names are the same in every framework)."""
    if source.driver == to and name_map is None:
        raise ConfigurationError(f"{source.where} was written by driver {to!r} already; nothing to convert.")
    known = source.classes is not None

    def classes(path: str) -> tuple[str, ...] | None:
        return (source.classes or {}).get(path, ()) if known else None

    mapped = {_module_path(path, name_map): names for path, names in (source.classes or {}).items()}
    neutral = to_neutral(source.tensors, source.layout, classes, name_map)
    converted = from_neutral(neutral, layout, lambda path: mapped.get(path, ()) if known else None)
    converted.update(companions(neutral, source.layout, layout))
    return converted, mapped


def _module_path(path: str, name_map: NameMap) -> str:
    """Module path ``path`` of the source under ``name_map`` (asked about a tensor of that module)."""
    return split_name(rename(f"{path}.x" if path else "x", name_map))[0]

