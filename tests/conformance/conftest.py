"""The conformance suite runs once per backend whose package and framework are installed."""

from __future__ import annotations

import pytest

from .kits import KITS, installed


def pytest_generate_tests(metafunc):
    if "kit" in metafunc.fixturenames:
        params = [pytest.param(name, marks=pytest.mark.skipif(not installed(name), reason=f"{name} backend not installed"))
                  for name in KITS]
        metafunc.parametrize("kit", params, indirect=True)


@pytest.fixture
def kit(request):
    return KITS[request.param]()
