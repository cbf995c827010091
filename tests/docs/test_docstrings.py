"""Every public class and function has a docstring: the API reference of the site is generated from them.

Public means exported in ``__all__`` of ``drivetrain``, ``drivetrain.backend``, ``drivetrain.testing`` or
``drivetrain.loggers``, and, for a class, every method and property it defines whose name does not start
with ``_``. A method that overrides a documented one (a callback hook, a logger's ``open``) may rely on the
docstring it inherits, as ``help()`` and the reference do. Constants (``CONTRACT_VERSION``, ``CHECKS``) are
described on their module's page.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect

import pytest

MODULES = ("drivetrain", "drivetrain.backend", "drivetrain.testing", "drivetrain.loggers")


def public_objects() -> dict[str, object]:
    """``{qualified name: object}`` of every exported class and function, each listed once."""
    found: dict[str, object] = {}
    seen: set[int] = set()
    for module_name in MODULES:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            obj = getattr(module, name)
            if (inspect.isclass(obj) or inspect.isfunction(obj)) and id(obj) not in seen:
                seen.add(id(obj))
                found[f"{module_name}.{name}"] = obj
    return found


def _where(obj: object) -> str:
    try:
        return inspect.getsourcefile(obj).split("/core/")[-1]  # type: ignore[arg-type, union-attr]
    except TypeError:
        return "?"


def undocumented() -> list[str]:
    """``name (file)`` of each public class, function, method or property without a docstring."""
    missing = []
    for qualified, obj in public_objects().items():
        own = obj.__dict__.get("__doc__") if inspect.isclass(obj) else obj.__doc__
        if not (own or "").strip():
            missing.append(f"{qualified} ({_where(obj)})")
        if not inspect.isclass(obj):
            continue
        fields = {f.name for f in dataclasses.fields(obj)} if dataclasses.is_dataclass(obj) else set()
        for name, member in vars(obj).items():
            if name.startswith("_") or name in fields:  # a dataclass field's default is a value, not a method
                continue
            function = member.fget if isinstance(member, property) else getattr(member, "__func__", member)
            if not (inspect.isfunction(function) or isinstance(member, property)):
                continue  # a class attribute: documented where the class describes it
            documented = inspect.getdoc(member) if isinstance(member, property) else inspect.getdoc(getattr(obj, name))
            if not (documented or "").strip():
                missing.append(f"{qualified}.{name} ({_where(function)})")
    return missing


def test_the_public_api_is_found() -> None:
    objects = public_objects()
    assert {"drivetrain.Trainer", "drivetrain.backend.ModuleDriver", "drivetrain.testing.ContractSuite",
            "drivetrain.loggers.Logger"} <= set(objects)


def test_every_public_name_has_a_docstring() -> None:
    missing = undocumented()
    assert not missing, "public names without a docstring:\n" + "\n".join(missing)


@pytest.mark.parametrize("module_name", MODULES)
def test_every_public_module_has_a_docstring(module_name: str) -> None:
    assert (importlib.import_module(module_name).__doc__ or "").strip()
