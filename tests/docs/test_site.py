"""The documentation site builds with ``mkdocs build --strict`` (mkdocs.yml at the repository root).

Strict mode turns every warning into a failure: a broken link or #anchor, a page missing from the
navigation, a reference mkdocstrings cannot resolve. The built site is then read back: the API
reference has an entry for every public name, its signatures are formatted (the docs env installs
ruff for mkdocstrings) and its arguments are tables, definition lists render, pages link to pages
(``page.html``, so the site opens from disk), the capabilities table lists every installed driver,
and the search index finds ``Trainer``. The build's duration is printed (``-s`` shows it).
"""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .test_examples import DOCS, ROOT, doc_pages

pytest.importorskip("mkdocs", reason="the docs env installs mkdocs-material and mkdocstrings-python")

API_PAGES = {"drivetrain": "api/drivetrain", "drivetrain.backend": "api/backend",
             "drivetrain.testing": "api/testing", "drivetrain.loggers": "api/loggers"}


@pytest.fixture(scope="module")
def build(tmp_path_factory) -> tuple[Path, str]:
    """The site built from this checkout, and the build's log."""
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "OMP_NUM_THREADS": "1", "GLOG_minloglevel": "2"}
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    seconds = time.perf_counter() - started
    print(f"mkdocs build --strict took {seconds:.1f} s")
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stderr[-6000:]}"
    return out, done.stderr


@pytest.fixture(scope="module")
def site(build: tuple[Path, str]) -> Path:
    return build[0]


def _html(site: Path, page: str) -> str:
    return (site / f"{page}.html").read_text(encoding="utf-8")


@pytest.mark.timeout(900)
def test_signatures_are_formatted(build: tuple[Path, str]) -> None:
    site, log = build
    assert "Formatting signatures requires" not in log, "install ruff (or black) where mkdocs runs"
    html = _html(site, "api/drivetrain")
    entry = html[html.index('id="drivetrain.Trainer"'):]
    signature = entry[entry.index("doc-signature"):]
    signature = signature[:signature.index("</code>")]
    assert signature.count("\n") > 30, "Trainer's signature is not one parameter per line"


@pytest.mark.timeout(900)
def test_arguments_are_tables_and_definition_lists_render(site: Path) -> None:
    api = _html(site, "api/drivetrain")
    trainer = api[api.index('id="drivetrain.Trainer"'):api.index('id="drivetrain.Evaluator"')]
    assert "<table" in trainer and "<code>evaluate_every</code>" in trainer
    guide = _html(site, "user-guide/trainer")
    assert "<dl>" in guide and "<dt><code>evaluate_every</code></dt>" in guide


@pytest.mark.timeout(900)
def test_every_page_is_in_the_navigation(site: Path) -> None:
    built = {p.relative_to(DOCS).with_suffix("").as_posix() for p in doc_pages()}
    missing = [page for page in built if not (site / f"{page}.html").exists()]
    assert not missing, missing
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    unlisted = [page for page in built if f"{page}.md" not in config]
    assert not unlisted, f"pages not in mkdocs.yml's nav: {unlisted}"


@pytest.mark.timeout(900)
@pytest.mark.parametrize("module_name", sorted(API_PAGES))
def test_the_api_reference_has_every_public_name(site: Path, module_name: str) -> None:
    """Every name has an entry on its module's page; ``drivetrain.Driver``'s is on ``drivetrain.backend``'s."""
    html = _html(site, API_PAGES[module_name])
    module = importlib.import_module(module_name)
    names = [n for n in module.__all__ if not n.startswith("__")]
    missing = [n for n in names if f'id="{module_name}.{n}"' not in html]
    backend = importlib.import_module("drivetrain.backend")
    elsewhere = [n for n in missing if module_name == "drivetrain" and getattr(backend, n, None) is getattr(module, n)
                 and f'id="drivetrain.backend.{n}"' in _html(site, API_PAGES["drivetrain.backend"])
                 and f'href="backend.html#drivetrain.backend.{n}"' in html]
    missing = [n for n in missing if n not in elsewhere]
    assert not missing, f"{API_PAGES[module_name]} has no entry for {missing}"


@pytest.mark.timeout(900)
def test_pages_link_to_files_so_the_site_opens_from_disk(site: Path) -> None:
    html = _html(site, "index")
    assert 'href="user-guide/trainer.html"' in html
    assert not re.search(r'href="[\w./-]+/"', html), "a link to a folder opens a directory listing from disk"


@pytest.mark.timeout(900)
def test_the_capabilities_table_is_generated_from_the_installed_drivers(site: Path) -> None:
    from drivetrain import available_drivers

    html = _html(site, "backends/index")
    for name, spec in available_drivers().items():
        row = re.search(rf"<td><code>{re.escape(name)}</code></td>(.*?)</tr>", html, flags=re.DOTALL)
        assert row is not None, f"no row for the installed driver {name!r}"
        assert ", ".join(spec.capabilities.precisions) in row[1]
    for backend in ("jittor", "oneflow"):  # shipped here, absent from the docs env: read from the checkout
        assert f"<td><code>{backend}</code></td>" in html
    assert "drivetrain:capabilities" not in html


@pytest.mark.timeout(900)
def test_search_finds_the_trainer(site: Path) -> None:
    index = json.loads((site / "search" / "search_index.json").read_text(encoding="utf-8"))
    hits = [doc["location"] for doc in index["docs"] if "Trainer" in doc["title"] or "Trainer" in doc["text"]]
    assert any(h.startswith("api/drivetrain.html") for h in hits), hits[:10]
    assert any(h.startswith("user-guide/trainer.html") for h in hits), hits[:10]
