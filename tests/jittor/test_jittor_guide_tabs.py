"""The documentation's pages run with their jittor content tabs chosen.

The docs environment has no jittor, so a page's jittor tabs are fenced ``python no-run`` there;
here each such page runs in order, in one namespace, with the jittor tab of every tab set that
has one (the first tab elsewhere).
"""

import pytest

from ..docs.test_examples import clean_globals, tab_page_test  # noqa: F401 - clean_globals is a fixture

pytestmark = pytest.mark.jittor

test_page_runs_with_its_jittor_tabs = tab_page_test("jittor")
