"""Shared pytest setup: single-threaded frameworks (2-core machine) and skip reasons."""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import pytest  # noqa: E402

PHASE_VARIABLE = "DRIVETRAIN_TEST_PHASE"
"""``local``: leave out the tests marked ``distributed`` (they start several processes and some bound how
long a failing rank takes to stop the others); ``processes``: run only those. Unset: everything.
``tools/suite.py`` runs each backend env as a ``local`` job and a ``processes`` job, three jobs at a time."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    phase = os.environ.get(PHASE_VARIABLE, "")
    if not phase:
        return
    if phase not in ("local", "processes"):
        raise pytest.UsageError(f"{PHASE_VARIABLE}={phase!r}: use 'local', 'processes' or leave it unset.")
    keep = phase == "processes"
    selected = [item for item in items if (item.get_closest_marker("distributed") is not None) == keep]
    deselected = [item for item in items if (item.get_closest_marker("distributed") is not None) != keep]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = selected


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A phase that leaves nothing of an env to run (no process tests in the docs env) is not a failure."""
    if os.environ.get(PHASE_VARIABLE) and exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED:
        session.exitstatus = pytest.ExitCode.OK
