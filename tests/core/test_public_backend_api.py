"""Backends reach the core only through its public API: ``drivetrain.backend`` and ``drivetrain``.

The core's private modules (``drivetrain._common.errors``, ``drivetrain._data.sampler``, ``drivetrain._distributed.spawn``,
...) may change in any release; a backend that imports them breaks with it. This test reads
the source of every backend package in the repository, and of the example third-party backend,
with :mod:`ast` (no framework is imported) and fails on any way into a private module: an
``import``/``from ... import`` of ``drivetrain._x`` (or of ``_x`` from ``drivetrain``), an
``importlib.import_module``/``__import__`` call naming one (also relative to ``"drivetrain"``),
an attribute such as ``drivetrain._common.errors`` on an imported ``drivetrain``, and a relative import
that climbs out of the backend's own package. The message names the file, the line and the
public name to import instead when there is one.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import NamedTuple

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "third_party_backend" / "drivetrain_numpy"
EXPECTED = {"drivetrain_torch", "drivetrain_paddle", "drivetrain_jittor", "drivetrain_oneflow", "drivetrain_numpy",
            "drivetrain_deepspeed", "drivetrain_jax"}
CORE = "drivetrain"
PUBLIC_MODULES = ("drivetrain.backend", "drivetrain")  # where a replacement is looked up, in this order


class Reach(NamedTuple):
    line: int
    code: str  # what the source does, e.g. "from drivetrain._common.errors import DriverError"
    name: str | None  # the name it wants from the private module, when it names one


def backend_packages() -> list[Path]:
    found = [p for p in ROOT.glob("backends/*/drivetrain_*") if (p / "__init__.py").is_file()]
    return sorted(found) + [EXAMPLE]


def is_private(module: str) -> bool:
    """``drivetrain._x``, ``drivetrain.testing._y``: a module of the core below a ``_`` name."""
    parts = module.split(".")
    return parts[0] == CORE and any(p.startswith("_") and not p.startswith("__") for p in parts[1:])


def resolve(name: str, package: str | None) -> str:
    """``importlib.import_module(name, package)``'s absolute module name."""
    if not name.startswith(".") or not package:
        return name
    level = len(name) - len(name.lstrip("."))
    base = package.split(".")
    base = base[: len(base) - level + 1] if level <= len(base) else []
    return ".".join(base + ([name.lstrip(".")] if name.lstrip(".") else []))


def private_reaches(source: str, depth: int = 1) -> list[Reach]:
    """Every way ``source`` reaches a private core module; ``depth`` is how deep the file sits in
    its package (1 for ``pkg/mod.py``), so a relative import climbing higher is caught too."""
    tree = ast.parse(source)
    found: list[Reach] = []
    core_aliases: set[str] = set()  # local names bound to the drivetrain package by ``import drivetrain...``
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == CORE:
                    bound = alias.asname or CORE
                    if alias.asname is None or alias.name == CORE:
                        core_aliases.add(bound)
                if is_private(alias.name):
                    found.append(Reach(node.lineno, f"import {alias.name}", None))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                if node.level > depth:
                    found.append(Reach(node.lineno, f"from {'.' * node.level}{node.module or ''} import ...", None))
                continue
            module = node.module or ""
            for alias in node.names:
                if is_private(module):
                    found.append(Reach(node.lineno, f"from {module} import {alias.name}", alias.name))
                elif module.split(".")[0] == CORE and is_private(f"{module}.{alias.name}"):
                    found.append(Reach(node.lineno, f"from {module} import {alias.name}", None))
                elif module == CORE and alias.name == CORE:
                    core_aliases.add(alias.asname or alias.name)
        elif isinstance(node, ast.Call):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if called not in ("import_module", "__import__") or not node.args:
                continue
            args = [a.value if isinstance(a, ast.Constant) and isinstance(a.value, str) else None
                    for a in node.args[:2]]
            package = next((kw.value.value for kw in node.keywords if kw.arg == "package"
                            and isinstance(kw.value, ast.Constant)), args[1] if len(args) > 1 else None)
            if args[0] is not None and is_private(resolve(args[0], package if called == "import_module" else None)):
                found.append(Reach(node.lineno, f"{called}({args[0]!r}{f', {package!r}' if package else ''})", None))
    for node in ast.walk(tree):  # drivetrain._common.errors.DriverError on an imported drivetrain
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in core_aliases \
                and node.attr.startswith("_") and not node.attr.startswith("__"):
            found.append(Reach(node.lineno, f"{node.value.id}.{node.attr}", None))
    return sorted(found)


def public_replacement(name: str | None) -> str | None:
    """``from drivetrain.backend import name`` (or ``from drivetrain ...``) when that module exports it."""
    if name is None:
        return None
    import importlib

    for module in PUBLIC_MODULES:
        if name in getattr(importlib.import_module(module), "__all__", ()):
            return f"from {module} import {name}"
    return None


def describe(path: Path, reach: Reach) -> str:
    where = f"{path.relative_to(ROOT)}:{reach.line}: `{reach.code}`"
    fix = public_replacement(reach.name)
    if fix:
        return f"{where} -> use `{fix}`"
    wanted = f"{reach.name!r} is not public yet: export it from drivetrain.backend (and document it in " \
             "docs/backend-author-guide.md)" if reach.name else "import the names you need from drivetrain.backend"
    return f"{where} -> {wanted}"


# -------------------------------------------------------------------------- tests
def test_every_backend_package_is_scanned() -> None:
    """Guards the scan itself: a test over no files could never fail."""
    packages = backend_packages()
    assert {p.name for p in packages} == EXPECTED, packages
    for package in packages:
        assert len(list(package.rglob("*.py"))) >= 3, package


@pytest.mark.parametrize("package", backend_packages(), ids=lambda p: p.name)
def test_a_backend_imports_only_the_public_core_api(package: Path) -> None:
    problems = []
    for path in sorted(package.rglob("*.py")):
        depth = len(path.relative_to(package).parts)
        problems += [describe(path, reach) for reach in private_reaches(path.read_text(encoding="utf-8"), depth)]
    assert not problems, (
        f"{package.name} reaches into the core's private modules, which may change in any release; import from "
        "drivetrain.backend (or drivetrain) instead:\n  " + "\n  ".join(problems)
    )


def test_the_checker_finds_every_way_in() -> None:
    source = "\n".join([
        "import drivetrain",  # 1: fine
        "from drivetrain import Trainer, DriverError",  # 2: fine
        "from drivetrain.backend import move_nested",  # 3: fine
        "from drivetrain._common.errors import DriverError, Nope",  # 4
        "import drivetrain._data.sampler as s",  # 5
        "from drivetrain import _spawn",  # 6
        "from drivetrain.testing import _kit",  # 7
        "x = drivetrain._distributed.mixin",  # 8
        "importlib.import_module('drivetrain._format.safetensors_writer')",  # 9
        "import_module('._param_matching', 'drivetrain')",  # 10
        "__import__('drivetrain._common.errors')",  # 11
        "from .. import sibling",  # 12: climbs out of a package one level deep
        "from . import state",  # 13: fine
        "import drivetrain.backend as b; b.__doc__; drivetrain.__version__",  # 14: fine
        "import_module('.driver', 'drivetrain_torch')",  # 15: fine
    ])
    reaches = private_reaches(source, depth=1)
    assert [r.line for r in reaches] == [4, 4, 5, 6, 7, 8, 9, 10, 11, 12], reaches
    assert [r.name for r in reaches[:2]] == ["DriverError", "Nope"]
    assert public_replacement("DriverError") == "from drivetrain.backend import DriverError"
    assert public_replacement("available_drivers") == "from drivetrain import available_drivers"
    assert public_replacement("Nope") is None
    message = describe(ROOT / "backends" / "x.py", reaches[0])
    assert message == "backends/x.py:4: `from drivetrain._common.errors import DriverError` -> use " \
                      "`from drivetrain.backend import DriverError`", message
    assert "'Nope' is not public yet" in describe(ROOT / "backends" / "x.py", reaches[1])
    assert private_reaches("from .. import state", depth=2) == []  # pkg/sub/mod.py reaching pkg.state
