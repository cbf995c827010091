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
import logging
import os
import platform
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pluggy

from .._common import ConfigurationError, DriverNotFoundError, PluginLoadError, __version__, did_you_mean
from .._distributed import (
    check_not_batch_shell,
    check_slurm_world,
    start_task_processes,
    task_processes_asked,
)
from ._driver import CONTRACT_VERSION, Capabilities, Driver
from ._weight_layout import NEUTRAL, WeightLayout

PROJECT = "drivetrain"
ENTRY_POINT_GROUP = "drivetrain"
STRICT_ENV = "DRIVETRAIN_STRICT_PLUGINS"
ALLOW_ENV = "DRIVETRAIN_PLUGINS_ALLOW"
DENY_ENV = "DRIVETRAIN_PLUGINS_DENY"
TRACE_ENV = "DRIVETRAIN_TRACE_PLUGINS"

logger = logging.getLogger("drivetrain.plugins")

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

@dataclass(frozen=True)
class KnownBackend:
    """A backend this project publishes: how to install it, and on which Pythons its framework exists."""

    extra: str
    framework_pin: str = ""
    max_python: tuple[int, int] | None = None
    """The newest Python the framework publishes working wheels for; None when any supported one works."""
    why_not: str = ""
    builds_on: tuple[str, ...] = ()
    """The backends of this project this one is built on (installed with it from a checkout)."""


# Backends this project publishes, so a missing one gets the right pip command (or the reason there is none).
KNOWN_BACKENDS: dict[str, KnownBackend] = {
    "torch": KnownBackend("torch"),
    "paddle": KnownBackend("paddle", "paddlepaddle==3.3.1"),
    "jittor": KnownBackend("jittor"),
    "oneflow": KnownBackend(
        "oneflow", 'oneflow==0.9.0 "numpy<2" nvidia-cudnn-cu11==8.5.0.96 nvidia-cublas-cu11==11.10.3.66',
        max_python=(3, 10),
        why_not="OneFlow publishes working wheels (oneflow 0.9.0) only for Python <= 3.10 (on 3.11+ pip installs "
        "oneflow 0.7.0, which has no native library)"),
    "deepspeed": KnownBackend("deepspeed", builds_on=("torch",)),
    "jax": KnownBackend("jax"),
}


def _install_sentence(name: str) -> str:
    how = known_install(name)
    return f"Install it {how}" if how.startswith("from ") else how[0].upper() + how[1:]


def known_install(name: str) -> str:
    """How to install known backend ``name`` today: the command that works from a checkout first, then the
    package-index one for once drivetrain is published (or, for a framework without wheels for this Python,
    what to do instead)."""
    how = install_hint(name)
    if not how.startswith("pip "):
        return how
    return f"{checkout_install_hint(name)} (once drivetrain is published: {how})"


def checkout_install_hint(name: str) -> str:
    """The command that installs known backend ``name`` from a drivetrain checkout (no package index serves it yet).

    >>> checkout_install_hint("paddle")
    'from a drivetrain checkout: pip install -c constraints.txt -e . -e backends/paddle paddlepaddle==3.3.1'
    """
    known = KNOWN_BACKENDS[name]
    pin = f" {known.framework_pin}" if known.framework_pin else ""
    python = ""
    if known.max_python is not None:
        python = f" (Python {'.'.join(map(str, known.max_python))})"
    folders = " ".join(f"-e backends/{backend}" for backend in (*known.builds_on, name))
    return f"from a drivetrain checkout{python}: pip install -c constraints.txt -e . {folders}{pin}"


def install_hint(name: str) -> str:
    """The pip command for backend ``name`` from a package index; for a framework with no wheels for this
    Python, what to do instead. A known backend's command (``pip install "drivetrain[torch]"``) works once the
    packages are published; :func:`checkout_install_hint` gives the one that works from a checkout."""
    known = KNOWN_BACKENDS.get(name)
    if known is None:
        return f"pip install drivetrain-{name}"
    command = f'pip install "drivetrain[{known.extra}]"' + (f" {known.framework_pin}" if known.framework_pin else "")
    if known.max_python is not None and sys.version_info[:2] > known.max_python:
        newest = ".".join(map(str, known.max_python))
        return (f"no install works on this Python {platform.python_version()}: {known.why_not}. Create a Python "
                f"{newest} environment and install there {checkout_install_hint(name)} (once drivetrain is "
                f"published: {command})")
    return command


@dataclass(frozen=True)
class DriverSpec:
    """What a backend tells the core about one of its drivers, without importing its framework.

    A backend's plugin returns these from its ``drivetrain_driver_specs`` hook; the
    [backend author guide](../backend-author-guide.md) shows one.

    Args:
        name: the driver's name, as users write it in ``Trainer(driver=...)``.
        framework: the framework's top-level module (``"torch"``), looked up, never imported, to say
            whether it is installed.
        factory: ``"module:callable"``; the callable is ``factory(model, device, **options) -> Driver``
            and is imported only when the driver is chosen.
        model_modules: top-level module names whose classes this driver claims for ``driver="auto"``
            (checked along the model class's MRO, no import needed).
        capabilities: what the driver can do (`Capabilities`).
        contract_versions: the driver contract versions the backend implements; required (an empty tuple
            is refused).
        distribution: the package providing the driver (``"drivetrain-torch"``), for versions and messages.
        install: the command that installs what the driver needs, shown when it is missing.
        detect: ``detect(model_class) -> bool``, claiming models instead of ``model_modules``.
        seed_function: ``"module:function"`` seeding the framework's generators, called by
            ``seed_everything`` only when the framework is already imported.
        weight_layout: how this framework's model files differ from drivetrain's neutral layout (torch's
            names and shapes): the rules that let another framework's model load this one's weights and back;
            default: no difference.
        testing_kit: ``"module:function"`` returning the backend's ``drivetrain.testing.BackendKit``, for
            ``drivetrain backends --check`` and ``drivetrain.testing.ContractSuite``.
    """

    name: str
    framework: str
    factory: str
    model_modules: tuple[str, ...] = ()
    capabilities: Capabilities = field(default_factory=Capabilities)
    contract_versions: tuple[int, ...] = ()
    distribution: str | None = None
    install: str | None = None
    detect: Callable[[type], bool] | None = None
    seed_function: str | None = None
    weight_layout: WeightLayout = NEUTRAL
    testing_kit: str | None = None

    def claims(self, model: Any) -> bool:
        """Whether ``driver="auto"`` may pick this driver for ``model``; imports nothing.

        Args:
            model: a model instance or class.

        Returns:
            What ``detect`` says if given, else whether a class along the model's MRO lives in one of
            ``model_modules``.
        """
        cls = model if isinstance(model, type) else type(model)
        if self.detect is not None:
            return bool(self.detect(cls))
        return any((klass.__module__ or "").split(".")[0] in self.model_modules for klass in cls.__mro__)

    @property
    def install_command(self) -> str:
        """How to install what this driver needs: the spec's own ``install`` text, else the known backend's
        commands (the one that works from a checkout first), else a guessed ``pip install drivetrain-<name>``."""
        if self.install:
            return self.install
        return known_install(self.name) if self.name in KNOWN_BACKENDS else install_hint(self.name)

    @property
    def upgrade_command(self) -> str:
        """How to upgrade this driver's backend: from a checkout for a backend of this project's (not on a
        package index yet), else its install command with ``--upgrade``."""
        backend = next((name for name in KNOWN_BACKENDS if self.distribution == f"drivetrain-{name}"), None)
        if backend is not None:
            folders = " ".join(f"-e backends/{name}" for name in (*KNOWN_BACKENDS[backend].builds_on, backend))
            return f"in your drivetrain checkout, git pull, then pip install -e . {folders}"
        return f"{self.install or install_hint(self.name)} --upgrade"

    def framework_installed(self) -> bool:
        """Whether the framework module (``framework``) can be imported here; it is looked up, not imported.

        Returns:
            True when it is installed.
        """
        return importlib.util.find_spec(self.framework) is not None

    def version(self) -> str | None:
        """The installed version of ``distribution``.

        Returns:
            The version string; None when the spec names no distribution or it is not installed.
        """
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
        raise NotImplementedError  # a specification: pluggy calls the plugins' implementations, never this

    @hookspec
    def drivetrain_loggers(self) -> dict[str, str]:
        """Return the run-record loggers this plugin provides: ``{"name": "package.module:LoggerClass"}``.

        The name is what users write in ``Trainer(loggers=["name"])``; the class is imported only then.
        """
        raise NotImplementedError


@dataclass
class Registry:
    """The installed drivers, which distribution provides each, and the plugins that were refused."""

    manager: pluggy.PluginManager
    specs: dict[str, DriverSpec] = field(default_factory=dict)
    broken: dict[str, str] = field(default_factory=dict)
    """Plugin (or ``plugin/driver``) name -> why it was skipped; shown by ``drivetrain backends``."""
    origins: dict[str, str] = field(default_factory=dict)
    """Plugin name -> the distribution it came from (``"<registered in code>"`` for register_plugin)."""
    skipped: dict[str, str] = field(default_factory=dict)
    """Plugin or driver name -> the distribution of what the allow/deny lists left out."""

    def collect(self) -> None:
        """Ask every plugin for its specs, one plugin at a time, so a bad one is named and skipped alone."""
        self.specs.clear()
        providers: dict[str, str] = {}
        for impl in self.manager.hook.drivetrain_driver_specs.get_hookimpls():  # in registration order
            plugin = impl.plugin_name
            origin = self.origins.get(plugin, "<registered in code>")
            try:
                answer = impl.function()
                specs = _checked_specs(answer, plugin, origin)
            except Exception as exc:
                _refuse(self, plugin, f"{origin}: drivetrain_driver_specs() failed: {type(exc).__name__}: {exc}")
                continue
            _trace(f"hook drivetrain_driver_specs answered by plugin {plugin!r} ({origin}): "
                   f"{[spec.name for spec in specs]}")
            for spec in specs:
                if not _driver_allowed(spec.name, plugin):
                    _trace(f"driver {spec.name!r} from plugin {plugin!r} skipped by {ALLOW_ENV}/{DENY_ENV}")
                    self.skipped[spec.name] = origin
                    continue
                origin = spec.distribution or self.origins.get(plugin, "<registered in code>")
                if spec.name in self.specs:
                    first = providers[spec.name]
                    _refuse(self, f"{plugin}/{spec.name}",
                            f"driver name {spec.name!r} is registered by both {first} and {origin} (plugin {plugin!r}); "
                            f"drivetrain uses the one from {first}. Uninstall one of them, or skip one with "
                            f"{DENY_ENV}=<its plugin name>.")
                    continue
                self.specs[spec.name] = spec
                providers[spec.name] = origin


def _checked_specs(answer: Any, plugin: str, origin: str) -> list[DriverSpec]:
    """The hook's answer as a list of well-formed specs, or a ValueError saying what is wrong."""
    if answer is None:
        return []
    if not isinstance(answer, (list, tuple)):
        raise ValueError(f"it returned a {type(answer).__name__}; it must return a list of drivetrain.DriverSpec")
    for spec in answer:
        if not isinstance(spec, DriverSpec):
            raise ValueError(f"it returned a {type(spec).__name__} in its list; every item must be a drivetrain.DriverSpec")
        problems = []
        if not isinstance(spec.name, str) or not spec.name or spec.name == "auto" or spec.name != spec.name.strip():
            problems.append(f"name={spec.name!r} must be a non-empty name other than 'auto'")
        if not isinstance(spec.framework, str) or not spec.framework:
            problems.append(f"framework={spec.framework!r} must name the framework's top-level module")
        for attr in ("factory", "seed_function", "testing_kit"):
            value = getattr(spec, attr)
            if (value is not None or attr == "factory") and (
                    not isinstance(value, str) or value.count(":") != 1 or not all(value.split(":"))):
                problems.append(f"{attr}={value!r} must be 'package.module:function'")
        if not isinstance(spec.contract_versions, tuple) or not all(
                isinstance(v, int) and not isinstance(v, bool) for v in spec.contract_versions):
            problems.append(f"contract_versions={spec.contract_versions!r} must be a tuple of ints, e.g. "
                            f"({CONTRACT_VERSION},)")
        capabilities: object = spec.capabilities  # a plugin's value: its annotation is not a guarantee
        if not isinstance(capabilities, Capabilities):
            problems.append(f"capabilities={spec.capabilities!r} must be a drivetrain.Capabilities")
        layout: object = spec.weight_layout
        if not isinstance(layout, WeightLayout):
            problems.append(f"weight_layout={spec.weight_layout!r} must be a drivetrain.WeightLayout")
        if problems:
            raise ValueError(f"its DriverSpec {spec.name!r} is malformed: " + "; ".join(problems))
    return list(answer)


def _refuse(registry: Registry, key: str, message: str) -> None:
    """Skip a plugin (or one of its drivers) with a warning; an error under strict mode."""
    if _strict():
        raise PluginLoadError(f"drivetrain plugin {key!r} refused: {message} Unset {STRICT_ENV} to skip it with a "
                              "warning instead.")
    registry.broken[key] = message
    _trace(f"plugin {key!r} refused: {message}")
    warnings.warn(f"drivetrain plugin {key!r} is skipped: {message}", RuntimeWarning, stacklevel=4)


_registry: Registry | None = None


def _strict() -> bool:
    return os.environ.get(STRICT_ENV, "").lower() in ("1", "true", "yes")


def _name_list(variable: str) -> set[str] | None:
    value = os.environ.get(variable)
    if value is None or not value.strip():
        return None
    return {name.strip() for name in value.split(",") if name.strip()}


def _allowed(name: str) -> bool:
    """Whether the allow/deny environment lists let plugin or driver ``name`` in."""
    deny = _name_list(DENY_ENV)
    if deny is not None and name in deny:
        return False
    allow = _name_list(ALLOW_ENV)
    return allow is None or name in allow


def _driver_allowed(driver: str, plugin: str) -> bool:
    """A driver is skipped when its name or its plugin's is denied, or an allow list names neither."""
    deny = _name_list(DENY_ENV) or set()
    if driver in deny or plugin in deny:
        return False
    allow = _name_list(ALLOW_ENV)
    return allow is None or driver in allow or plugin in allow


def _trace(message: str) -> None:
    logger.debug(message)


def _configure_tracing() -> None:
    """Under DRIVETRAIN_TRACE_PLUGINS=1, send the plugin log to stderr (once) at DEBUG level."""
    if os.environ.get(TRACE_ENV, "").lower() not in ("1", "true", "yes"):
        return
    logger.setLevel(logging.DEBUG)
    if not any(getattr(h, "_drivetrain_trace", False) for h in logger.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("drivetrain.plugins: %(message)s"))
        handler._drivetrain_trace = True  # type: ignore[attr-defined]  # our marker on a stdlib handler
        logger.addHandler(handler)


def _load_entry_points(registry: Registry) -> None:
    manager = registry.manager
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if manager.get_plugin(ep.name) is not None:
            continue
        origin = ep.dist.name if ep.dist is not None else "an unknown distribution"
        if not _allowed(ep.name):
            _trace(f"plugin {ep.name!r} ({origin}, {ep.value}) not loaded: excluded by {ALLOW_ENV}/{DENY_ENV}")
            registry.skipped[ep.name] = origin
            continue
        registry.origins[ep.name] = origin
        try:
            plugin = ep.load()
            manager.register(plugin, name=ep.name)
        except Exception as exc:  # a broken third-party plugin must not take the others down
            _refuse(registry, ep.name,
                    f"{origin}'s entry point `{ep.name} = {ep.value}` (group {ENTRY_POINT_GROUP!r}) cannot be loaded: "
                    f"{type(exc).__name__}: {exc}. Fix the entry point in {origin}'s pyproject.toml or reinstall "
                    f"{origin}.")
            continue
        _trace(f"plugin {ep.name!r} loaded from {origin} ({ep.value})")


def get_registry() -> Registry:
    """The process-wide registry, built on first use from the ``drivetrain`` entry points."""
    global _registry
    if _registry is None:
        _configure_tracing()
        manager = pluggy.PluginManager(PROJECT)
        manager.add_hookspecs(DrivetrainHookspecs)
        registry = Registry(manager)
        _load_entry_points(registry)
        registry.collect()
        _registry = registry
    return _registry


def register_plugin(plugin: Any, name: str | None = None) -> None:
    """Register a plugin object or module in code (tests, notebooks), like an entry point would.

    The drivers it describes are available at once; a malformed answer is refused with a warning like an
    installed plugin's (an error under ``DRIVETRAIN_STRICT_PLUGINS=1``).

    Args:
        plugin: an object or module with ``hookimpl``-decorated ``drivetrain_driver_specs`` (and/or
            ``drivetrain_loggers``) functions.
        name: the plugin's name (``DRIVETRAIN_PLUGINS_DENY`` and ``drivetrain backends`` use it); pluggy
            makes one up when None.

    Raises:
        ValueError: a plugin of that name is already registered.
    """
    registry = get_registry()
    registry.manager.register(plugin, name=name)
    registry.collect()


def reset_registry() -> None:
    """Forget discovered plugins; the next lookup scans entry points again."""
    global _registry
    _registry = None


def available_drivers() -> dict[str, DriverSpec]:
    """The installed drivers, found through the ``drivetrain`` entry points (and :func:`register_plugin`).

    Imports no framework: a spec says what its driver needs and can do. Plugins that fail to load are left
    out with a warning (``drivetrain backends`` lists them).

    Returns:
        ``{driver name: DriverSpec}``.
    """
    return dict(get_registry().specs)


def contract_problem(spec: DriverSpec) -> str | None:
    """Why this drivetrain cannot use ``spec``'s driver contract, naming both versions and the fix; None if it can."""
    package = spec.distribution or f"the package providing driver {spec.name!r}"
    if not spec.contract_versions:
        return (f"{package} declares no driver contract version; its DriverSpec must say "
                f"contract_versions=({CONTRACT_VERSION},) if it implements drivetrain's contract version "
                f"{CONTRACT_VERSION}. Upgrade {package} ({spec.upgrade_command}).")
    if CONTRACT_VERSION in spec.contract_versions:
        return None
    versions = ", ".join(str(v) for v in sorted(spec.contract_versions))
    mine = f"drivetrain {__version__} implements driver contract version {CONTRACT_VERSION}"
    if max(spec.contract_versions) < CONTRACT_VERSION:
        return (f"{package} implements driver contract version(s) {versions}, older than {mine}. "
                f"Upgrade the backend: {spec.upgrade_command} (or install an older drivetrain).")
    return (f"{package} implements driver contract version(s) {versions}, newer than {mine}. "
            "Upgrade drivetrain: in your drivetrain checkout, git pull, then pip install -e . (once drivetrain is "
            f"published: pip install --upgrade drivetrain), or install an older {package}.")


def drivers_listing(specs: dict[str, DriverSpec]) -> str:
    """``"installed drivers: numpy, torch."``: the drivers that can run here, then each installed driver whose
    framework module is missing, with what to install (the torch backend declares ``deepspeed``, which
    runs only once ``deepspeed`` itself is installed)."""
    runnable = sorted(name for name, spec in specs.items() if spec.framework_installed())
    listed = f"installed drivers: {', '.join(runnable) or 'none'}."
    for name, spec in sorted(specs.items()):
        if name not in runnable:
            listed += (f" Driver {name!r} is installed too but cannot run: its framework module {spec.framework!r} "
                       f"is missing. To install it: {spec.install_command}.")
    return listed


def driver_not_found(driver: str) -> DriverNotFoundError:
    """The error for a driver name that is not installed: the pip command for a known backend,
    else "unknown" with the closest installed or known name (shared by the Trainer and the CLI)."""
    registry = get_registry()
    installed = sorted(registry.specs)
    listed = drivers_listing(registry.specs)
    broken = f" Plugins that failed to load: {', '.join(registry.broken)}." if registry.broken else ""
    if driver in KNOWN_BACKENDS:
        return DriverNotFoundError(f"driver={driver!r} is not installed; {listed} {_install_sentence(driver)}.{broken}")
    hint = did_you_mean(driver, installed + [n for n in KNOWN_BACKENDS if n not in installed])
    return DriverNotFoundError(f"driver={driver!r} is unknown; {listed}{hint}{broken}")


def resolve_spec(driver: str, model: Any) -> DriverSpec:
    """Find the spec for ``driver`` (a name or ``"auto"``), with errors that say what to do."""
    registry = get_registry()
    if not isinstance(driver, str):
        raise DriverNotFoundError(f"driver={driver!r} must be a driver name such as 'torch', or 'auto'.")
    if driver == "auto":
        claimed = [spec for spec in registry.specs.values() if spec.claims(model)]
        if not claimed:
            raise DriverNotFoundError(
                f"driver='auto' found no installed driver for a model of type "
                f"{type(model).__module__}.{type(model).__qualname__}; {drivers_listing(registry.specs)} Pass "
                f"driver='<name>' or install the backend, e.g. {checkout_install_hint('torch')} (once drivetrain "
                f"is published: {install_hint('torch')})."
            )
        usable = [spec for spec in claimed if contract_problem(spec) is None and spec.framework_installed()]
        spec = (usable or claimed)[0]  # a usable one if any; else the first, whose error says what to fix
    elif driver in registry.specs:
        spec = registry.specs[driver]
    else:
        raise driver_not_found(driver)
    problem = contract_problem(spec)
    if problem:
        raise DriverNotFoundError(f"driver {spec.name!r}: {problem}")
    if not spec.framework_installed():
        raise DriverNotFoundError(
            f"driver={spec.name!r} needs the framework module {spec.framework!r}, which is not installed. "
            f"To install it: {spec.install_command}."
        )
    return spec


def _refuse_misspelt_options(backend_kwargs: dict[str, Any]) -> None:
    """``trch_kwargs=`` is a typo of ``torch_kwargs=``, not options for a driver named 'trch'.

    Options for a driver that is not installed here are passed over (one script may carry options for
    several frameworks), so only a name very close to a known driver's (difflib ratio >= 0.85) is refused.
    """
    known = set(available_drivers()) | set(KNOWN_BACKENDS)
    for name in backend_kwargs:
        if name in known:
            continue
        close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.85)
        if close:
            raise ConfigurationError(
                f"{name}_kwargs=: no driver is called {name!r}; did you mean {close[0]}_kwargs=? (Options for a "
                f"driver that is not installed are passed over, but {name!r} is too close to {close[0]!r} to be "
                "another driver's name.)"
            )


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
    _refuse_misspelt_options(backend_kwargs or {})
    module_name, _, attr = spec.factory.partition(":")
    factory = getattr(importlib.import_module(module_name), attr)
    framework_kwargs = (backend_kwargs or {}).get(spec.name)
    if framework_kwargs is not None:
        options["framework_kwargs"] = framework_kwargs
    return factory(model, device, **options)


def build_driver(driver: Any, model: Any, device: Any, **options: Any) -> Driver:
    if not isinstance(driver, (str, Driver)):
        raise ConfigurationError(
            f"driver={driver!r} is not accepted; pass a driver name ('torch', 'paddle', ...), 'auto', or a Driver."
        )
    nproc = options.get("nproc")
    with task_processes_asked(nproc) as task:  # nproc= in each task of srun: the backend may take it per task
        built = create_driver(driver, model, device, **options)
    check_not_batch_shell(nproc, built.world_size)
    check_slurm_world(built.name, built.world_size, nproc)
    if task is not None and task.step is not None:  # the backend placed this task's process 0: start the others
        plan = getattr(built, "plan", None)
        launcher = start_task_processes(task, timeout=getattr(plan, "timeout", 60.0),
                                        output=getattr(plan, "spawn_output", "inherit"),
                                        timeout_option=f"{built.name}_kwargs['timeout']")
        guard = getattr(built, "_guard", None)
        if guard is not None:  # a CollectiveGuard names a child that failed, stops them when this process fails
            guard.launcher = launcher
    return built
