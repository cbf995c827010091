"""No import cycle between the modules of a backend package.

A backend's single-process driver (``driver.py``) and its distributed driver
(``distributed.py``) must not import each other: the distributed driver builds on the
single one, and the factory the plugin points at (``factory.py``) is the only module that
knows both. More generally no two modules of a backend package may import each other,
directly or through others, at module level or lazily inside a function: a cycle makes
the import order matter and hides which module is the base of which. Read with
:mod:`ast`; no framework is imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "third_party_backend" / "drivetrain_numpy"


def backend_packages() -> list[Path]:
    found = [p for p in ROOT.glob("backends/*/drivetrain_*") if (p / "__init__.py").is_file()]
    return sorted(found) + [EXAMPLE]


def imported_siblings(source: str, package: str, siblings: set[str]) -> set[str]:
    """The modules of ``package`` (named in ``siblings``) that ``source``, a module directly inside it,
    imports anywhere: ``from .x import y``, ``from . import x``, ``import package.x``, ``from package import x``."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[1] for alias in node.names
                      if alias.name.startswith(f"{package}.")}
        elif isinstance(node, ast.ImportFrom) and (node.level == 1 or node.level == 0 and node.module
                                                   and node.module.split(".")[0] == package):
            parts = (node.module or "").split(".")[0 if node.level else 1:]
            if parts and parts[0]:
                found.add(parts[0])
            else:  # from . import x / from package import x: x may be a module of the package
                found |= {alias.name for alias in node.names}
    return found & siblings


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each strongly connected group of two or more modules (or a module importing itself), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1 or node in graph[node]:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def import_graph(package: Path) -> dict[str, set[str]]:
    modules = {p.stem: p for p in package.glob("*.py")}
    siblings = set(modules) - {"__init__"}  # importing the package itself is never a cycle of its modules
    return {name: imported_siblings(path.read_text(encoding="utf-8"), package.name, siblings)
            for name, path in modules.items()}


@pytest.mark.parametrize("package", backend_packages(), ids=lambda p: p.name)
def test_no_import_cycle_inside_a_backend_package(package: Path) -> None:
    graph = import_graph(package)
    assert len(graph) >= 3, graph  # the scan found the package's modules
    found = cycles(graph)
    assert not found, (
        f"{package.name}: these modules import each other (directly or through others): "
        + "; ".join(" <-> ".join(group) for group in found)
        + ". Move what both need into a module both import, or let a third module (e.g. factory.py, which "
        "builds either driver) import both."
    )


def test_the_graph_reader_and_the_cycle_finder() -> None:
    source = "\n".join([
        "from .driver import X", "from . import state as _s, plugin", "import pkg.precision",
        "from pkg import _rng", "from pkg.static import f", "def f():\n    from .distributed import D",
        "import torch.distributed as dist", "from torch import distributed", "from .. import outside",
    ])
    siblings = {"driver", "state", "plugin", "precision", "_rng", "static", "distributed", "factory"}
    assert imported_siblings(source, "pkg", siblings) == siblings - {"factory"}
    assert imported_siblings("import torch.distributed as dist", "pkg", siblings) == set()
    graph = {"factory": {"driver", "distributed"}, "distributed": {"driver"}, "driver": {"plugin"}, "plugin": set()}
    assert cycles(graph) == []
    graph["driver"].add("distributed")
    assert cycles(graph) == [["distributed", "driver"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"d"}}) == [["a", "b", "c"], ["d"]]
