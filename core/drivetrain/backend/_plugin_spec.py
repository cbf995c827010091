"""The entry point of a backend laid out by drivetrain's convention, written once.

Each of drivetrain's backends had the same plugin hook: one :class:`DriverSpec` whose
factory, testing kit and distribution follow from the backend's name. A backend whose
package is ``drivetrain_<name>`` (with ``factory.py`` holding ``create_driver`` and
``testing_kit.py`` holding ``<name>_kit``) and whose distribution is
``drivetrain-<name>`` gets its hook from :func:`driver_specs_hook`, and names only
what is its own: the capabilities, the contract versions, the install line, the seed
function. Building the hook imports no framework, so the plugin module stays light.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ._driver import Capabilities
from ._plugins import DriverSpec, hookimpl


def driver_specs_hook(name: str, capabilities: Capabilities, *, contract_versions: tuple[int, ...],
                      variants: Mapping[str, Mapping[str, Any]] | None = None,
                      **fields: Any) -> Callable[[], list[DriverSpec]]:
    """A ``drivetrain_driver_specs`` hook returning the one conventional DriverSpec of backend ``name``.

    Assign it in the plugin module under that name (``drivetrain_driver_specs = driver_specs_hook(...)``).
    ``contract_versions`` is the literal tuple this release implements (never ``CONTRACT_VERSION``,
    which follows the core); ``fields`` set or override any other :class:`DriverSpec` field
    (``install``, ``seed_function``, ``framework``, ``model_modules``, ...). ``variants`` names further drivers
    of the same package (``{"torch_fsdp": {"factory": ..., "capabilities": ...}}``): each copies the main
    spec with its own fields, claims no model for ``driver="auto"`` and has no testing kit unless it says so.
    """
    package = f"drivetrain_{name}"
    framework = fields.get("framework", name)
    values: dict[str, Any] = dict(
        name=name,
        framework=framework,
        factory=f"{package}.factory:create_driver",
        model_modules=(framework,),
        capabilities=capabilities,
        distribution=f"drivetrain-{name}",
        contract_versions=contract_versions,
        testing_kit=f"{package}.testing_kit:{name}_kit",
    )
    values.update(fields)

    @hookimpl
    def drivetrain_driver_specs() -> list[DriverSpec]:
        """The backend's driver description; its factory is imported only when the driver is chosen."""
        return [DriverSpec(**values)] + [
            DriverSpec(**{**values, "name": variant, "model_modules": (), "testing_kit": None, **extra})
            for variant, extra in (variants or {}).items()]

    return drivetrain_driver_specs
