"""Shared pytest setup: single-threaded frameworks (2-core machine) and skip reasons."""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import pytest  # noqa: E402

PHASE_VARIABLE = "DRIVETRAIN_TEST_PHASE"
"""``local``: leave out the tests marked ``distributed`` (they start several processes and some bound how
long a failing rank takes to stop the others); ``processes``: run only those. Unset: everything.
``tools/suite.py`` runs each backend env as a ``local`` job and one or more ``processes`` jobs, three jobs at a
time."""
SHARD_VARIABLE = "DRIVETRAIN_TEST_SHARD"
"""``k/n``: keep the k-th of n shards of the selected tests (1-based), split by file so that a module's fixtures
run once. Files are dealt out heaviest first to the lightest shard, weighed by their module's ``SUITE_SECONDS``
(what the file took, measured alone; ``DEFAULT_SECONDS`` where a file does not say)."""
DEFAULT_SECONDS = 10.0


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
    if os.environ.get(SHARD_VARIABLE):
        _keep_shard(config, items, os.environ[SHARD_VARIABLE])


def _keep_shard(config: pytest.Config, items: list[pytest.Item], shard: str) -> None:
    try:
        k, n = (int(part) for part in shard.split("/"))
        if not 1 <= k <= n:
            raise ValueError
    except ValueError:
        raise pytest.UsageError(f"{SHARD_VARIABLE}={shard!r}: give k/n with 1 <= k <= n, e.g. 1/2.") from None
    by_file: dict[str, list[pytest.Item]] = {}
    for item in items:
        by_file.setdefault(str(item.path), []).append(item)

    def seconds(path: str) -> float:
        module = getattr(by_file[path][0], "module", None)
        return float(getattr(module, "SUITE_SECONDS", DEFAULT_SECONDS))

    loads, mine = [0.0] * n, set()
    for path in sorted(by_file, key=lambda path: (-seconds(path), path)):
        lightest = loads.index(min(loads))
        loads[lightest] += seconds(path)
        if lightest == k - 1:
            mine.add(path)
    deselected = [item for item in items if str(item.path) not in mine]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if str(item.path) in mine]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A phase that leaves nothing of an env to run (no process tests in the docs env) is not a failure."""
    if os.environ.get(PHASE_VARIABLE) and exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED:
        session.exitstatus = pytest.ExitCode.OK
