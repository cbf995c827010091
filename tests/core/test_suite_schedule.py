"""The rules by which ``tools/suite.py`` (what CI runs) picks the next job: builds before tests, one job at a
time for an env with ``commands_pre``, at most two process-test jobs while other jobs remain, and a third
once only process tests are left (the end of a run, when nothing else loads the machine)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("drivetrain_suite", ROOT / "tools" / "suite.py")
assert _spec is not None and _spec.loader is not None
suite = sys.modules["drivetrain_suite"] = importlib.util.module_from_spec(_spec)  # its dataclass looks itself up
_spec.loader.exec_module(suite)


def _jobs(*names: str) -> list:
    return [suite.Job(*name.split(":")) for name in names]


def _pick(waiting: list, running: list, done: set[str] = frozenset(), exclusive: set[str] = frozenset()) -> str | None:
    built = {f"{job.env}:build" for job in waiting + running} | set(done)
    job = suite._next(waiting, running, built, set(exclusive))
    return None if job is None else job.name


def test_a_third_process_job_waits_while_other_jobs_remain_and_starts_when_only_process_jobs_are_left() -> None:
    running = _jobs("paddle:processes", "oneflow:processes")
    assert _pick(_jobs("jax:processes", "docs:local"), running) == "docs:local"
    assert _pick(_jobs("jax:processes"), running + _jobs("docs:local")) is None
    assert _pick(_jobs("jax:processes", "jittor:processes"), running) == "jax:processes"
    assert _pick(_jobs("jittor:processes"), running + _jobs("jax:processes")) is None  # never a fourth


def test_tests_wait_for_their_env_s_build_and_an_env_with_commands_pre_runs_one_job_at_a_time() -> None:
    waiting = _jobs("jittor:local")
    assert suite._next(waiting, _jobs("jittor:build"), set(), set()) is None
    assert _pick(waiting, []) == "jittor:local"
    assert _pick(_jobs("jittor:processes"), _jobs("jittor:local"), exclusive={"jittor"}) is None
    assert _pick(_jobs("torch:processes"), _jobs("torch:local")) == "torch:processes"


def test_every_env_of_tox_ini_has_its_jobs_in_the_priority_order() -> None:
    missing = [f"{env}:{phase}" for env in suite.ENVS for phase in ("build", "local")
               if f"{env}:{phase}" not in suite.PRIORITY]
    missing += [f"{env}:processes" for env in suite.PROCESS_SHARDS if f"{env}:processes" not in suite.PRIORITY]
    assert not missing, f"add {missing} to PRIORITY in tools/suite.py (an env missing there runs last)"
