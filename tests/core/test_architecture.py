"""The core's folders follow docs/architecture.md: every folder has a row, imports only point down the
table, and a folder reaches another only through that folder's ``__init__`` (never a module inside it).

Read with :mod:`ast`, nothing imported; every import counts (inside functions, under ``TYPE_CHECKING``).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "core" / "drivetrain"
PAGE = ROOT / "docs" / "architecture.md"
TOP = "<package modules>"  # __init__.py, _cli.py, loggers.py ...: above every folder


def documented_folders() -> list[str]:
    """The folders of the page's table, lowest layer first."""
    section = PAGE.read_text(encoding="utf-8").split("## The folders", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `([\w]+)` \|", section, re.M)


def folders() -> set[str]:
    return {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}


def folder_of(parts: list[str]) -> str:
    return parts[0] if parts and parts[0] in folders() else TOP


def cross_folder_imports() -> list[tuple[Path, int, str, list[str]]]:
    """``(file, line, importing folder, imported module path)`` for each import that leaves its folder."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
        package = parts[:-1]
        source = folder_of(parts)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = package[:len(package) - node.level + 1]
                targets = [base + (node.module.split(".") if node.module else [])]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "drivetrain":
                targets = [node.module.split(".")[1:]]
            elif isinstance(node, ast.Import):
                targets = [a.name.split(".")[1:] for a in node.names if a.name.split(".")[0] == "drivetrain"]
            else:
                continue
            for target in targets:
                if folder_of(target) != source:
                    found.append((path, node.lineno, source, target))
    return found


def test_every_folder_has_a_row_on_the_architecture_page() -> None:
    table, actual = documented_folders(), folders()
    assert len(table) == len(set(table)), f"a folder is listed twice in {PAGE.name}: {table}"
    assert not actual - set(table), (f"core/drivetrain has folder(s) {sorted(actual - set(table))} that "
                                    f"docs/architecture.md does not list: add a row saying what each is for")
    assert not set(table) - actual, f"docs/architecture.md lists folder(s) {sorted(set(table) - actual)} that do not exist"


def test_a_folder_reaches_another_only_through_its_init() -> None:
    private = [f"{path.relative_to(ROOT)}:{line} imports {'.'.join(target)}"
               for path, line, _, target in cross_folder_imports() if len(target) > 1 and target[0] in folders()]
    assert not private, ("import the names from the folder itself (export them from its __init__.py): "
                         + "; ".join(private))


def test_imports_point_down_the_table() -> None:
    order = {name: i for i, name in enumerate(documented_folders())}
    order[TOP] = len(order)
    upward = [f"{path.relative_to(ROOT)}:{line} ({source}) imports {'.'.join(target) or 'drivetrain'} "
              f"({folder_of(target)})" for path, line, source, target in cross_folder_imports()
              if order[folder_of(target)] > order[source]
              and not (source == "testing" and not target)]  # the kit uses the public API, as backends do
    assert not upward, ("a lower folder imports a higher one (docs/architecture.md lists them lowest first); "
                        "move the shared part down: " + "; ".join(upward))


@pytest.mark.parametrize("folder", sorted(folders()))
def test_each_folder_says_what_it_is_for(folder: str) -> None:
    doc = ast.get_docstring(ast.parse((PACKAGE / folder / "__init__.py").read_text(encoding="utf-8")))
    assert doc and len(doc) > 30, f"core/drivetrain/{folder}/__init__.py needs a docstring saying what it is for"


def test_the_checks_see_a_violation(tmp_path, monkeypatch) -> None:
    """The readers find an upward and a private import in a fake package (so the tests above can fail)."""
    fake = tmp_path / "drivetrain"
    for folder, code in {"_low": "from .._high.mod import x\n", "_high": "x = 1\n"}.items():
        (fake / folder).mkdir(parents=True)
        (fake / folder / "__init__.py").write_text('"""A folder for the test of the architecture checks."""\n' + code)
        (fake / folder / "mod.py").write_text("x = 1\n")
    (fake / "__init__.py").write_text("")
    monkeypatch.setattr(__import__(__name__, fromlist=["x"]), "PACKAGE", fake)
    found = cross_folder_imports()
    assert [(source, target) for _, _, source, target in found] == [("_low", ["_high", "mod"])]
