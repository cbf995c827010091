"""The user guide's pages run with their JAX content tabs chosen.

The docs environment has no jax, so a page's ``jax`` tabs are fenced ``python no-run`` there; here
each such page runs in order, in one namespace, with the JAX tab of every tab set that has one (the
first tab elsewhere), in a process of its own (as the jittor suite does).
"""

import subprocess
import sys
from pathlib import Path

import pytest

from ..docs.test_examples import ROOT, _page_id, pages_with_tab

pytestmark = pytest.mark.jax

PAGES = pages_with_tab("jax")
_RUN = ("import sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]); "
        "from tests.docs.test_examples import run_page; run_page(Path(sys.argv[2]), 'jax')")


def test_every_page_with_per_framework_tabs_has_a_jax_tab() -> None:
    assert {_page_id(p) for p in PAGES} == {_page_id(p) for p in pages_with_tab("paddle")}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_page_runs_with_its_jax_tabs(page: Path, tmp_path) -> None:
    proc = subprocess.run([sys.executable, "-c", _RUN, str(ROOT), str(page)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=280)
    assert proc.returncode == 0, f"{_page_id(page)} failed with its jax tabs:\n{proc.stdout[-4000:]}{proc.stderr[-4000:]}"
