"""The documentation site builds with ``mkdocs build --strict`` (mkdocs.yml at the repository root).

Strict mode turns every warning into a failure: a broken link or #anchor, a page missing from the
navigation, a reference mkdocstrings cannot resolve. The built site is then read back: the API
reference has an entry for every public name, the capabilities table lists every installed driver,
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
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "OMP_NUM_THREADS": "1", "GLOG_minloglevel": "2"}
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    seconds = time.perf_counter() - started
    print(f"mkdocs build --strict took {seconds:.1f} s")
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stderr[-6000:]}"
    return out


@pytest.mark.timeout(900)
def test_every_page_is_in_the_navigation(site: Path) -> None:
    built = {p.relative_to(DOCS).with_suffix("").as_posix() for p in doc_pages()}
    missing = [page for page in built if not (site / (page.removesuffix("index") or ".") / "index.html").exists()
               and not (site / page / "index.html").exists()]
    assert not missing, missing
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    unlisted = [page for page in built if f"{page}.md" not in config]
    assert not unlisted, f"pages not in mkdocs.yml's nav: {unlisted}"


@pytest.mark.timeout(900)
@pytest.mark.parametrize("module_name", sorted(API_PAGES))
def test_the_api_reference_has_every_public_name(site: Path, module_name: str) -> None:
    html = (site / API_PAGES[module_name] / "index.html").read_text(encoding="utf-8")
    names = [n for n in importlib.import_module(module_name).__all__ if not n.startswith("__")]
    missing = [n for n in names if f'id="{module_name}.{n}"' not in html]
    assert not missing, f"{API_PAGES[module_name]} has no entry for {missing}"


@pytest.mark.timeout(900)
def test_the_capabilities_table_is_generated_from_the_installed_drivers(site: Path) -> None:
    from drivetrain import available_drivers

    html = (site / "backends" / "index.html").read_text(encoding="utf-8")
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
    assert any(h.startswith("api/drivetrain/") for h in hits), hits[:10]
    assert any(h.startswith("user-guide/trainer/") for h in hits), hits[:10]
