"""mkdocs hook: the parts of the site written from the code at build time, never by hand.

A page asks for generated content with an HTML comment (invisible when the Markdown is read on GitHub):

- ``<!-- drivetrain:capabilities -->``: one row per driver, from the plugin registry's
  :class:`drivetrain.DriverSpec` of every installed backend; a backend this project ships that the
  building environment lacks is read from its plugin module in the checkout (its entry point, which
  imports no framework) and marked as such.
- ``<!-- drivetrain:capabilities NAME -->``: the same for the drivers of the ``drivetrain-NAME`` package,
  with each driver's notes.
- ``<!-- drivetrain:api MODULE -->``: one mkdocstrings entry per name of ``MODULE.__all__``, so the API
  reference lists every public name and nothing else.

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
MARKER = re.compile(r"<!-- drivetrain:(?P<kind>capabilities|api)(?: (?P<arg>[\w.]+))? -->")
FENCE_MARKS = re.compile(r"^(?P<open> *(?:`{3,}|~{3,})[\w+-]+)[ \t]+[\w -]+$", re.MULTILINE)
SIDE_BY_SIDE = '<div class="grid" markdown>'
LINK = re.compile(r"\[(?P<text>[^\]\n]+)\]\((?P<target>\.\./[^)\s#]+)(?:#[^)\s]*)?\)")


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ANN001 - mkdocs' hook signature
    """Replace each ``drivetrain:`` marker of a page with what it asks for; adapt fences and outside links."""
    if SIDE_BY_SIDE in markdown:  # the two code columns need the width the table of contents takes
        page.meta.setdefault("hide", []).append("toc")
    markdown = FENCE_MARKS.sub(r"\g<open>", markdown)
    markdown = LINK.sub(lambda match: _outside_link(match, DOCS / page.file.src_uri), markdown)
    return MARKER.sub(lambda match: _generate(match["kind"], match["arg"]), markdown)


def _outside_link(match: re.Match, page: Path) -> str:
    """A link to an existing repository file outside docs/ as text naming the file; any other link unchanged."""
    target = (page.parent / match["target"]).resolve()
    if target.is_relative_to(DOCS) or not target.is_relative_to(ROOT) or not target.exists():
        return match[0]
    return f"{match['text']} (`{target.relative_to(ROOT).as_posix()}` in the repository)"


def _generate(kind: str, arg: str | None) -> str:
    if kind == "api":
        if arg is None:
            raise ValueError("<!-- drivetrain:api MODULE --> needs a module name")
        return api_entries(arg)
    return capabilities_table(arg)


def api_entries(module_name: str) -> str:
    """A ``::: module.Name`` block for every public name of ``module_name`` (``__version__`` aside)."""
    module = importlib.import_module(module_name)
    names = [name for name in module.__all__ if not name.startswith("__")]
    return "\n\n".join(f"::: {module_name}.{name}" for name in names) + "\n"


def driver_rows() -> list[tuple[object, str]]:
    """``(DriverSpec, source)`` for every installed driver, then for the shipped backends not installed here."""
    from drivetrain import available_drivers
    from drivetrain._plugins import KNOWN_BACKENDS

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
