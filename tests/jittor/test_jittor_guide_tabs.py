"""The documentation's pages run with their jittor content tabs chosen.

The docs environment has no jittor, so a page's jittor tabs are fenced ``python no-run`` there;
here each such page runs in order, in one namespace, with the jittor tab of every tab set that
has one (the first tab elsewhere).
"""

import subprocess
import sys
from pathlib import Path

import pytest

from ..docs.test_examples import ROOT, _page_id, pages_with_tab

pytestmark = pytest.mark.jittor

PAGES = pages_with_tab("jittor")
_RUN = ("import sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]); "
        "from tests.docs.test_examples import run_page; run_page(Path(sys.argv[2]), 'jittor')")


@pytest.mark.timeout(600)
@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_page_runs_with_its_jittor_tabs(page: Path, tmp_path) -> None:
    """Each page in a process of its own: jittor runs operations lazily, and random ones a page before
    left pending would draw from the generator after this page's ``seed_everything(0)``, so the page's
    seeded runs would not repeat (the checkpoints page compares two of them bit for bit)."""
    proc = subprocess.run([sys.executable, "-c", _RUN, str(ROOT), str(page)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=540)
    assert proc.returncode == 0, f"{_page_id(page)} failed with its jittor tabs:\n{proc.stdout[-4000:]}{proc.stderr[-4000:]}"
