"""No import cycle between the core's modules (issue 30): each module depends one way.

Every import counts, at module level, inside a function or under ``TYPE_CHECKING``: a cycle
hides which module is the base of which. Where two modules need each other's names, the
shared part moves into a third (``_format/shard_layout.py`` for the shard data the
Driver names and the checkpoint code uses), a facade re-exports instead of being imported
(``drivetrain.backend``), or the dependent side names what it needs as a Protocol
(``backend/_model_step.Driver``). Read with :mod:`ast`; nothing is imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

from .test_backend_import_cycles import cycles

CORE = Path(__file__).resolve().parents[2] / "core"


def core_modules() -> dict[str, Path]:
    """``{dotted name: file}`` of every module of the core package (a package by its own name)."""
    modules = {}
    for path in (CORE / "drivetrain").rglob("*.py"):
        parts = path.relative_to(CORE).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The core modules ``name`` imports anywhere in its file (relative or absolute)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name in modules}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            for alias in node.names:
                target = f"{base}.{alias.name}"
                found.add(target if target in modules else base)
    return (found & set(modules)) - {name}


def test_no_import_cycle_inside_the_core() -> None:
    modules = core_modules()
    graph = {name: imports_of(name, path, modules) for name, path in modules.items()}
    assert len(graph) > 50 and "drivetrain.backend._driver" in graph["drivetrain.backend"]  # the scan sees the core
    found = cycles(graph)
    assert not found, ("these core modules import each other (directly or through others): "
                       + "; ".join(" <-> ".join(group) for group in found)
                       + ". Move what both need into a module both import, or name it as a Protocol on one side.")


def test_the_reader_resolves_relative_imports(tmp_path) -> None:
    modules = {"pkg": Path("__init__.py"), "pkg._driver": Path("x.py"),
               "pkg._store": Path("__init__.py"), "pkg._store.sharded": Path("y.py")}
    probe = tmp_path / "folder.py"
    probe.write_text("from .._driver import Driver\nfrom . import sharded\ndef f():\n    from .. import _driver\n",
                     encoding="utf-8")
    assert imports_of("pkg._store.folder", probe, modules) == {"pkg._driver", "pkg._store.sharded"}
    assert cycles({"a": {"b"}, "b": {"a"}}) == [["a", "b"]]
