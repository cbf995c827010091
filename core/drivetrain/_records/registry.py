"""Turning ``Trainer(loggers=...)`` into logger objects: built-in names, plugin names, or objects.

Built-ins are named ``"csv"``, ``"jsonl"``, ``"tensorboard"``, ``"visualdl"``, ``"mlflow"`` and ``"wandb"``; a plugin adds names through
the ``drivetrain_loggers`` hook of the same entry points that provide drivers
(``{"name": "package.module:LoggerClass"}``), imported only when a run asks for it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any, cast

from .._common import ConfigurationError, did_you_mean
from .logger import Logger

BUILT_IN = {
    "csv": "drivetrain._records.files:CSVLogger",
    "jsonl": "drivetrain._records.files:JSONLinesLogger",
    "tensorboard": "drivetrain._records.tensorboard:TensorBoardLogger",
    "visualdl": "drivetrain._records.visualdl_logger:VisualDLLogger",
    "mlflow": "drivetrain._records.mlflow_logger:MLflowLogger",
    "wandb": "drivetrain._records.wandb_logger:WandbLogger",
}


def logger_names() -> dict[str, str]:
    """Every logger name a run may ask for -> ``"module:Class"``: the built-ins, then the plugins' own.

    Returns:
        ``{name: "module:Class"}``.
    """
    from ..backend import get_registry

    names = dict(BUILT_IN)
    hook = get_registry().manager.hook.drivetrain_loggers
    for impl in hook.get_hookimpls():
        try:
            answer = cast(Mapping[str, str], impl.function())
        except Exception as exc:
            raise ConfigurationError(
                f"plugin {impl.plugin_name!r}: drivetrain_loggers() failed: {type(exc).__name__}: {exc}"
            ) from exc
        for name, target in answer.items():
            names.setdefault(str(name), str(target))
    return names


def make_loggers(loggers: Any) -> list[Logger]:
    """``loggers=`` as a list of :class:`Logger` objects (a string or one object is a list of one)."""
    if loggers is None:
        return []
    items = [loggers] if isinstance(loggers, (str, Logger)) else loggers
    if not isinstance(items, (list, tuple)):
        raise ConfigurationError(
            f"loggers={loggers!r} is not accepted; pass a list of logger names (e.g. ['csv', 'tensorboard']) "
            "or drivetrain.loggers objects (e.g. [CSVLogger('runs/a')])."
        )
    made: list[Logger] = []
    for item in items:
        if isinstance(item, str):
            made.append(_by_name(item)())
        elif isinstance(item, Logger):
            made.append(item)
        else:
            raise ConfigurationError(
                f"loggers=[..., {item!r}, ...]: {type(item).__name__} is not a logger; pass a name such as 'csv' or "
                "an instance of a drivetrain.loggers.Logger subclass."
            )
    return made


def _by_name(name: str) -> Callable[[], Logger]:
    names = logger_names()
    if name not in names:
        raise ConfigurationError(
            f"loggers=[{name!r}]: no logger of that name.{did_you_mean(name, names)} Available: "
            f"{', '.join(sorted(names))}."
        )
    module, _, attribute = names[name].partition(":")
    try:
        factory = getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(f"logger {name!r} ({names[name]}) cannot be imported: {exc}") from exc
    return factory
