"""mkdocs hook: the parts of the site written from the code at build time, never by hand.

A page asks for generated content with an HTML comment (invisible when the Markdown is read on GitHub):

- ``<!-- drivetrain:capabilities -->``: one row per driver, from the plugin registry's
  :class:`drivetrain.DriverSpec` of every installed backend; a backend this project ships that the
  building environment lacks is read from its plugin module in the checkout (its entry point, which
  imports no framework) and marked as such.
- ``<!-- drivetrain:capabilities NAME -->``: the same for the drivers of the ``drivetrain-NAME`` package,
  with each driver's notes.
- ``<!-- drivetrain:api MODULE NAME ... -->``: one mkdocstrings entry per name listed, so a page groups its
  names under headings of its own; ``<!-- drivetrain:api MODULE -->`` (no names): every other name of
  ``MODULE.__all__`` that no marker of the page lists, so the API reference lists every public name.
- ``<!-- drivetrain:api-see MODULE NAME ... -->``: names documented on ``MODULE``'s page, as links there
  (``drivetrain.Driver`` is the backend contract, on ``drivetrain.backend``'s page).

It also adapts what reads well on GitHub to the site: a fence's run marks (```` ```python no-run ````, read by
tests/docs) are dropped so the block highlights as its language, and a link to a repository file outside
docs/ (``../../bench/README.md``) becomes its path in the repository, since the site does not carry it.
"""

from __future__ import annotations

import importlib
import re
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
MARKER = re.compile(r"<!-- drivetrain:(?P<kind>capabilities|api|api-see)(?: (?P<arg>[\w.]+))?(?P<names>(?: \w+)*) -->")
FENCE_MARKS = re.compile(r"^(?P<open> *(?:`{3,}|~{3,})[\w+-]+)[ \t]+[\w -]+$", re.MULTILINE)
SIDE_BY_SIDE = '<div class="grid" markdown>'
LINK = re.compile(r"\[(?P<text>[^\]\n]+)\]\((?P<target>\.\./[^)\s#]+)(?:#[^)\s]*)?\)")


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ANN001 - mkdocs' hook signature
    """Replace each ``drivetrain:`` marker of a page with what it asks for; adapt fences and outside links."""
    if SIDE_BY_SIDE in markdown:  # the two code columns need the width the table of contents takes
        page.meta.setdefault("hide", []).append("toc")
    markdown = FENCE_MARKS.sub(r"\g<open>", markdown)
    markdown = LINK.sub(lambda match: _outside_link(match, DOCS / page.file.src_uri), markdown)
    named = {name for m in MARKER.finditer(markdown) if m["kind"] != "capabilities" for name in m["names"].split()}
    return MARKER.sub(lambda match: _generate(match["kind"], match["arg"], match["names"].split(), named), markdown)


def _outside_link(match: re.Match, page: Path) -> str:
    """A link to an existing repository file outside docs/ as text naming the file; any other link unchanged."""
    target = (page.parent / match["target"]).resolve()
    if target.is_relative_to(DOCS) or not target.is_relative_to(ROOT) or not target.exists():
        return match[0]
    return f"{match['text']} (`{target.relative_to(ROOT).as_posix()}` in the repository)"


def _generate(kind: str, arg: str | None, names: list[str], named: set[str]) -> str:
    """What a marker asks for; ``named`` holds the names every marker of the page lists."""
    if kind == "capabilities":
        return capabilities_table(arg)
    if arg is None:
        raise ValueError(f"<!-- drivetrain:{kind} MODULE --> needs a module name")
    if kind == "api-see":
        return see_also(arg, names)
    rest = [name for name in public_names(arg) if name not in named]
    return api_entries(arg, names or rest)


def public_names(module_name: str) -> list[str]:
    """``module_name.__all__`` without ``__version__`` and the like."""
    return [name for name in importlib.import_module(module_name).__all__ if not name.startswith("__")]


def api_entries(module_name: str, names: list[str]) -> str:
    """A ``::: module.Name`` block for each of ``names``, each a public name of ``module_name``."""
    unknown = sorted(set(names) - set(public_names(module_name)))
    if unknown:
        raise ValueError(f"<!-- drivetrain:api {module_name} ... -->: {unknown} are not in {module_name}.__all__")
    return "\n\n".join(f"::: {module_name}.{name}" for name in names) + "\n"


def see_also(module_name: str, names: list[str]) -> str:
    """A list of links to the entries of ``names`` on ``module_name``'s page."""
    api_entries(module_name, names)  # the same check of the names
    return "".join(f"- [`{name}`][{module_name}.{name}]\n" for name in names)


def driver_rows() -> list[tuple[object, str]]:
    """``(DriverSpec, source)`` for every installed driver, then for the shipped backends not installed here."""
    from drivetrain import available_drivers
    from drivetrain.backend._plugins import KNOWN_BACKENDS

    rows = [(spec, "installed") for _, spec in sorted(available_drivers().items())]
    present = {spec.distribution for spec, _ in rows}
    for backend in KNOWN_BACKENDS:
        if f"drivetrain-{backend}" not in present:
            rows += [(spec, "checkout") for spec in _checkout_specs(backend)]
    return rows


def _checkout_specs(backend: str) -> list:
    """The specs declared by ``backends/<backend>``'s plugin module, imported without its package ``__init__``."""
    package = f"drivetrain_{backend}"
    folder = ROOT / "backends" / backend / package
    if not (folder / "plugin.py").is_file():
        return []
    saved = {name: mod for name, mod in sys.modules.items() if name == package or name.startswith(package + ".")}
    stub = types.ModuleType(package)
    stub.__path__ = [str(folder)]
    sys.modules[package] = stub
    try:
        return list(importlib.import_module(f"{package}.plugin").drivetrain_driver_specs())
    finally:
        for name in [n for n in sys.modules if n == package or n.startswith(package + ".")]:
            del sys.modules[name]
        sys.modules.update(saved)


def _cell(values: tuple[str, ...]) -> str:
    return ", ".join(values) or "no"


def capabilities_table(backend: str | None) -> str:
    """A Markdown table of the drivers' declared capabilities (all drivers, or those of ``drivetrain-<backend>``)."""
    rows = driver_rows()
    if backend is not None:
        rows = [(spec, source) for spec, source in rows if spec.distribution == f"drivetrain-{backend}"]
        if not rows:
            raise ValueError(f"<!-- drivetrain:capabilities {backend} -->: no driver of drivetrain-{backend} found")
    lines = ["| driver | package | framework | precisions | devices | distributed | contract checks |",
             "|---|---|---|---|---|---|---|"]
    for spec, source in rows:
        caps = spec.capabilities
        version = spec.version() if source == "installed" else None
        package = f"{spec.distribution} {version}" if version else f"{spec.distribution}\\*"
        checks = "yes" if spec.testing_kit else "no kit"
        lines.append(f"| `{spec.name}` | {package} | {spec.framework} | {_cell(caps.precisions)} | "
                     f"{_cell(caps.devices)} | {_cell(caps.distributed)} | {checks} |")
    text = "\n".join(lines) + "\n"
    if any(source == "checkout" for _, source in rows):
        text += ("\n\\* not installed where this site was built: the row comes from the backend's plugin module in "
                 "the repository; the other rows come from the installed packages.\n")
    if any(spec.testing_kit for spec, _ in rows):
        text += ("\n*contract checks*: whether the backend ships a kit for `drivetrain backends --check NAME` "
                 "(drivetrain.testing's conformance checks).\n")
    if backend is not None:
        for spec, _ in rows:
            notes = spec.capabilities.notes
            if notes:
                text += f"\nWhat the `{spec.name}` driver declares about itself:\n\n"
                text += "".join(f"- **{key}**: {_escape(note)}\n" for key, note in notes.items())
    return text


def _escape(text: str) -> str:
    """A note as Markdown text: underscores and asterisks literal, ``<`` not read as HTML."""
    return re.sub(r"([*_<\[\]])", r"\\\1", text)
