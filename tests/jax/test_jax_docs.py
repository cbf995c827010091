"""docs/backends/jax.md runs: its ``python no-run`` blocks in order, in one namespace, from the repository root.

The general docs environment has no jax, so the page's blocks are fenced ``python no-run`` there and executed here
instead, the way tests/docs runs a page.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ..docs.test_examples import code_blocks

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "backends" / "jax.md"

pytestmark = pytest.mark.jax


@pytest.mark.timeout(300)
def test_page_blocks_run_in_order(monkeypatch):
    monkeypatch.chdir(ROOT)  # the page reads tests/data/cross_framework, as from a checkout
    blocks = [b for b in code_blocks(PAGE.read_text(encoding="utf-8")) if b.info == "python no-run"]
    assert len(blocks) >= 5
    namespace: dict = {"__name__": "docs_jax"}
    for block in blocks:
        exec(compile("\n" * (block.line - 1) + block.code, str(PAGE), "exec"), namespace)  # errors point at the page
    assert namespace["trainer"].driver.name == "jax"
