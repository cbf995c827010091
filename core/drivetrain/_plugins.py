"""Finding drivers: pluggy hookspecs, entry-point discovery, and choosing a driver by name or model.

Discovery is lazy (the plugin manager is built on first use, not at import) and
light: a backend's entry point returns :class:`DriverSpec` descriptions whose
factory is a ``"module:function"`` string, so no framework is imported until
its driver is actually chosen.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import importlib.util
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pluggy

from ._driver import CONTRACT_VERSION, Capabilities, Driver
from ._errors import DriverNotFoundError, PluginLoadError

PROJECT = "drivetrain"
ENTRY_POINT_GROUP = "drivetrain"
STRICT_ENV = "DRIVETRAIN_STRICT_PLUGINS"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

# Backends this project publishes, so a missing one gets the right pip command.
KNOWN_BACKENDS: dict[str, str] = {
    "torch": "torch",
    "paddle": "paddle",
    "jittor": "jittor",
    "oneflow": "oneflow",
}


def install_hint(name: str) -> str:
    return f'pip install "drivetrain[{name}]"' if name in KNOWN_BACKENDS else f"pip install drivetrain-{name}"


@dataclass(frozen=True)
class DriverSpec:
    """What a backend tells the core about one of its drivers, without importing its framework.

    ``factory`` is ``"module:callable"``; the callable is
    ``factory(model, device, **options) -> Driver`` and is imported only when chosen.
    ``model_modules`` are top-level module names whose classes this driver claims
    for ``driver="auto"`` (checked along the model class's MRO, no import needed).
    """

    name: str
    framework: str
    factory: str
    model_modules: tuple[str, ...] = ()
    capabilities: Capabilities = field(default_factory=Capabilities)
    contract_versions: tuple[int, ...] = ()
    """Driver contract versions the backend implements; required (an empty tuple is refused)."""
    distribution: str | None = None
    install: str | None = None
    detect: Callable[[type], bool] | None = None
    seed_function: str | None = None
    """``"module:function"`` seeding the framework's generators, called by ``seed_everything``
    only when the framework is already imported."""
    testing_kit: str | None = None
    """``"module:function"`` returning the backend's :class:`drivetrain.testing.BackendKit`, for
    ``drivetrain backends --check`` and :class:`drivetrain.testing.ContractSuite`."""

    def claims(self, model: Any) -> bool:
        cls = model if isinstance(model, type) else type(model)
        if self.detect is not None:
            return bool(self.detect(cls))
        return any((klass.__module__ or "").split(".")[0] in self.model_modules for klass in cls.__mro__)

    @property
    def install_command(self) -> str:
        return self.install or install_hint(self.name)

    def framework_installed(self) -> bool:
        return importlib.util.find_spec(self.framework) is not None

    def version(self) -> str | None:
        if not self.distribution:
            return None
        try:
            return importlib.metadata.version(self.distribution)
        except importlib.metadata.PackageNotFoundError:
            return None


class DrivetrainHookspecs:
    """Hooks a backend plugin implements (decorate with ``drivetrain.hookimpl``)."""

    @hookspec
    def drivetrain_driver_specs(self) -> list[DriverSpec]:
        """Return the :class:`DriverSpec` of every driver this plugin provides. Must not import a framework."""


@dataclass
class Registry:
    """The installed drivers and the plugins that failed to load."""

    manager: pluggy.PluginManager
    specs: dict[str, DriverSpec] = field(default_factory=dict)
    broken: dict[str, str] = field(default_factory=dict)

    def collect(self) -> None:
        self.specs.clear()
        for plugin_specs in self.manager.hook.drivetrain_driver_specs():
            for spec in plugin_specs or ():
                self.specs.setdefault(spec.name, spec)


_registry: Registry | None = None


def _strict() -> bool:
    return os.environ.get(STRICT_ENV, "").lower() in ("1", "true", "yes")


def _load_entry_points(manager: pluggy.PluginManager, broken: dict[str, str]) -> None:
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if manager.get_plugin(ep.name) is not None:
            continue
        try:
            plugin = ep.load()
            manager.register(plugin, name=ep.name)
        except Exception as exc:  # a broken third-party plugin must not take the others down
            message = f"{type(exc).__name__}: {exc}"
            if _strict():
                raise PluginLoadError(
                    f"drivetrain plugin {ep.name!r} ({ep.value}) failed to load: {message}. "
                    f"Unset {STRICT_ENV} to skip broken plugins with a warning."
                ) from exc
            broken[ep.name] = message
            warnings.warn(
                f"drivetrain plugin {ep.name!r} ({ep.value}) failed to load and is skipped: {message}",
                RuntimeWarning,
                stacklevel=3,
            )


def get_registry() -> Registry:
    """The process-wide registry, built on first use from the ``drivetrain`` entry points."""
    global _registry
    if _registry is None:
        manager = pluggy.PluginManager(PROJECT)
        manager.add_hookspecs(DrivetrainHookspecs)
        registry = Registry(manager)
        _load_entry_points(manager, registry.broken)
        registry.collect()
        _registry = registry
    return _registry


def register_plugin(plugin: Any, name: str | None = None) -> None:
    """Register a plugin object or module in code (tests, notebooks), like an entry point would."""
    registry = get_registry()
    registry.manager.register(plugin, name=name)
    registry.collect()


def reset_registry() -> None:
    """Forget discovered plugins; the next lookup scans entry points again."""
    global _registry
    _registry = None


def available_drivers() -> dict[str, DriverSpec]:
    return dict(get_registry().specs)


def resolve_spec(driver: str, model: Any) -> DriverSpec:
    """Find the spec for ``driver`` (a name or ``"auto"``), with errors that say what to do."""
    registry = get_registry()
    installed = sorted(registry.specs)
    if not isinstance(driver, str):
        raise DriverNotFoundError(f"driver={driver!r} must be a driver name such as 'torch', or 'auto'.")
    if driver == "auto":
        claimed = [spec for spec in registry.specs.values() if spec.claims(model)]
        if not claimed:
            raise DriverNotFoundError(
                f"driver='auto' found no installed driver for a model of type "
                f"{type(model).__module__}.{type(model).__qualname__}; installed drivers: "
                f"{', '.join(installed) or 'none'}. Pass driver='<name>' or install the backend, "
                f"e.g. {install_hint('torch')}."
            )
        spec = claimed[0]
    elif driver in registry.specs:
        spec = registry.specs[driver]
    else:
        broken = f" Plugins that failed to load: {', '.join(registry.broken)}." if registry.broken else ""
        if driver in KNOWN_BACKENDS:
            raise DriverNotFoundError(
                f"driver={driver!r} is not installed; installed drivers: {', '.join(installed) or 'none'}. "
                f"Install it with: {install_hint(driver)}.{broken}"
            )
        close = difflib.get_close_matches(driver, installed + list(KNOWN_BACKENDS), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise DriverNotFoundError(
            f"driver={driver!r} is unknown; installed drivers: {', '.join(installed) or 'none'}.{hint}{broken}"
        )
    if not spec.contract_versions:
        raise DriverNotFoundError(
            f"driver {spec.name!r} declares no driver contract version; its DriverSpec must say "
            f"contract_versions=({CONTRACT_VERSION},) if it implements this drivetrain's contract. "
            f"Upgrade the backend ({spec.install_command} --upgrade)."
        )
    if CONTRACT_VERSION not in spec.contract_versions:
        raise DriverNotFoundError(
            f"driver {spec.name!r} implements driver contract version(s) {list(spec.contract_versions)} but this "
            f"drivetrain needs version {CONTRACT_VERSION}; upgrade the backend ({spec.install_command} --upgrade) "
            "or install a drivetrain release that matches it."
        )
    if not spec.framework_installed():
        raise DriverNotFoundError(
            f"driver={spec.name!r} needs the framework module {spec.framework!r}, which is not installed. "
            f"Install it with: {spec.install_command}."
        )
    return spec


def create_driver(driver: Any, model: Any, device: Any, *,
                  backend_kwargs: dict[str, Any] | None = None, **options: Any) -> Driver:
    """Build the driver named ``driver`` (or take a ready :class:`Driver` instance as is).

    ``backend_kwargs`` maps a driver name to its framework options (``{"torch": {...}}``,
    from ``torch_kwargs=``); only the chosen driver's entry is passed, so one script can
    carry options for several frameworks.
    """
    if isinstance(driver, Driver):
        return driver
    spec = resolve_spec(driver, model)
    module_name, _, attr = spec.factory.partition(":")
    factory = getattr(importlib.import_module(module_name), attr)
    framework_kwargs = (backend_kwargs or {}).get(spec.name)
    if framework_kwargs is not None:
        options["framework_kwargs"] = framework_kwargs
    return factory(model, device, **options)
