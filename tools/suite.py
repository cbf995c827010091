"""Run the whole test suite the quick way: what CI runs (`.ci/run`) and the README's test command.

Each tox env of ``tox.ini`` gives a ``build`` job (``tox run --notest``: create the env, install), a
``local`` job (every test not marked ``distributed``) and, for the backends, ``processes`` jobs (the
tests marked ``distributed``: they start several processes through launchers, ``nproc=`` or
``mpirun``). ``tests/conftest.py`` selects a job's tests from ``DRIVETRAIN_TEST_PHASE`` and, where
an env's process tests are split (torch's), ``DRIVETRAIN_TEST_SHARD``. The jobs run three at a
time, in the order of :data:`PRIORITY`:

- an env's tests start once its build has ended; two test jobs of one env run at once only if the
  env has no ``commands_pre`` (jittor's re-points its editable installs at the checkout each run);
- torch's process tests are the critical path (9 min alone), so torch builds first and its two
  shards start at once; jittor's local job comes next (with a cold cache it compiles jittor for
  minutes); the rest fill the other slots around them;
- the process tests spend much of their time waiting for processes to start, meet and stop
  (paddle's used 98 s of CPU in 247 s), which is why more jobs than cores pay;
- at most two ``processes`` jobs run at once while other jobs remain, a third once only process
  jobs are left. Those are the critical path: about 30 min of them, two at a time, so a warm run
  takes 15-16 min whether three or four jobs run at once (``--jobs 4`` only loads the machine
  more; see docs/contributing.md). The time bounds the process tests check (a failing rank stops
  the others, Ctrl-C ends every rank) held at a load of 8 on this 2-core machine.

Usage::

    python tools/suite.py                    # everything (needs tox on PATH or beside this python)
    python tools/suite.py -e torch,core      # some envs only
    python tools/suite.py --jobs 1           # one job at a time (slower; for a loaded machine)
    python tools/suite.py -- -x -k resume    # arguments after -- go to every pytest

Each job's output is printed whole when it ends (and kept under ``.tox/suite-logs/``); the end is a
table of every job's result and minutes. It exits non-zero if any job failed.
"""

from __future__ import annotations

import argparse
import configparser
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOX_INI = configparser.ConfigParser(interpolation=None)
TOX_INI.read(ROOT / "tox.ini")
ENVS = tuple(TOX_INI.get("tox", "env_list").replace(",", " ").split())
"""Every env of tox.ini (its ``env_list``)."""
PROCESS_SHARDS = {"torch": 2, "paddle": 1, "jittor": 1, "oneflow": 1, "jax": 1}
"""The envs whose tests include some marked ``distributed``, and into how many jobs those are split."""
PRIORITY = ("torch:build", "torch:processes", "jittor:build", "jittor:local", "torch:local", "paddle:build",
            "paddle:local", "jax:build", "jax:local", "core:build", "core:local", "oneflow:build", "oneflow:local",
            "paddle:processes", "oneflow:processes", "jittor:processes", "jax:processes", "docs:build", "docs:local",
            "third_party:build", "third_party:local", "lint:build", "lint:local")
"""Start order when a slot is free (an env's processes shards share its place): the critical paths first (torch's
process tests; jittor's local job, which compiles jittor when its cache is cold: 13.9 min of a 21.3-minute cold
run that started it 5.6 min in), then the envs whose process tests are longest, the short ones last to fill the
gaps at the end. An env of tox.ini missing here runs last, never not at all."""
MAX_PROCESS_JOBS = 2
"""Process-test jobs at once while other jobs remain (one more once only process-test jobs are left)."""
LOGS = ROOT / ".tox" / "suite-logs"


@dataclass
class Job:
    env: str
    phase: str  # "build", "local" or "processes"
    shard: str = ""  # "k/n" for one of an env's process-test shards
    log: Path = field(init=False)
    process: subprocess.Popen | None = None
    started: float = 0.0
    seconds: float = 0.0
    code: int | None = None

    def __post_init__(self) -> None:
        self.log = LOGS / f"{self.name.replace(':', '-').replace('/', 'of')}.log"

    @property
    def name(self) -> str:
        return f"{self.env}:{self.phase}" + (f":{self.shard}" if self.shard else "")


def _with_commands_pre() -> set[str]:
    """The envs of tox.ini whose ``commands_pre`` must not run twice at once."""
    return {env for env in ENVS if TOX_INI.has_option(f"testenv:{env}", "commands_pre")}


def _tox() -> str:
    beside = Path(sys.executable).with_name("tox")
    found = str(beside) if beside.exists() else shutil.which("tox")
    if found is None:
        sys.exit("tools/suite.py needs tox: python3 -m venv .venv-tox && .venv-tox/bin/pip install 'tox>=4', "
                 "then run .venv-tox/bin/python tools/suite.py")
    return found


def _start(job: Job, tox: str, extra: list[str], t0: float) -> None:
    command = [tox, "run", "-e", job.env, *(["--notest"] if job.phase == "build" else extra)]
    print(f"[{(time.monotonic() - t0) / 60:5.1f} min] start {job.name}: {' '.join(command)}", flush=True)
    env = {**os.environ, **({} if job.phase == "build" else {"DRIVETRAIN_TEST_PHASE": job.phase})}
    if job.shard:
        env["DRIVETRAIN_TEST_SHARD"] = job.shard
    out = job.log.open("w")
    job.process = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, env=env)
    out.close()
    job.started = time.monotonic()


def _finish(job: Job, code: int, t0: float) -> None:
    job.code, job.seconds = code, time.monotonic() - job.started
    verdict = "ok" if code == 0 else f"FAILED (exit {code})"
    print(f"\n===== {job.name}: {verdict} in {job.seconds / 60:.1f} min (output below, also in {job.log})",
          flush=True)
    sys.stdout.write(job.log.read_text(errors="replace"))
    print(f"===== [{(time.monotonic() - t0) / 60:5.1f} min] end of {job.name}: {verdict}\n", flush=True)


def _next(waiting: list[Job], running: list[Job], done: set[str], exclusive: set[str]) -> Job | None:
    processes = sum(job.phase == "processes" for job in running)
    limit = MAX_PROCESS_JOBS + all(job.phase == "processes" for job in [*waiting, *running])
    for job in waiting:
        if job.phase != "build" and f"{job.env}:build" not in done:
            continue
        if any(other.env == job.env for other in running) and (job.phase == "build" or job.env in exclusive):
            continue
        if job.phase == "processes" and processes >= limit:
            continue
        return job
    return None


def run_jobs(jobs: list[Job], slots: int, tox: str, extra: list[str]) -> None:
    """Run ``jobs`` at most ``slots`` at a time under the rules of the module docstring."""
    LOGS.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    waiting, exclusive = list(jobs), _with_commands_pre()
    running: list[Job] = []
    done: set[str] = set()
    while waiting or running:
        while len(running) < slots and (job := _next(waiting, running, done, exclusive)) is not None:
            waiting.remove(job)
            _start(job, tox, extra, t0)
            running.append(job)
        time.sleep(0.5)
        for job in list(running):
            code = job.process.poll() if job.process else None
            if code is not None:
                running.remove(job)
                done.add(job.name)
                _finish(job, code, t0)
                if job.phase == "build" and code != 0:  # its tests cannot run: they stay "not run"
                    waiting = [other for other in waiting if other.env != job.env]
        if not running and waiting and _next(waiting, running, done, exclusive) is None:
            raise RuntimeError(f"no job can start: {[job.name for job in waiting]}")  # a bug in _next's rules


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-e", "--envs", default=",".join(ENVS), help="comma-separated tox envs (default: all)")
    parser.add_argument("--jobs", type=int, default=3, help="how many jobs run at once (default 3)")
    parser.add_argument("pytest_args", nargs="*", help="passed to every pytest (after --)")
    args = parser.parse_args(argv)
    envs = [env for env in args.envs.split(",") if env]
    unknown = sorted(set(envs) - set(ENVS))
    if unknown:
        parser.error(f"--envs: {', '.join(unknown)} is not an env of tox.ini; choose from {', '.join(ENVS)}")
    if args.jobs < 1:
        parser.error(f"--jobs {args.jobs}: give 1 or more")
    unlisted = [f"{env}:{phase}" for env in ENVS for phase in ("build", "local", "processes")
                if f"{env}:{phase}" not in PRIORITY]
    jobs = []
    for name in (*PRIORITY, *unlisted):
        env, phase = name.split(":")
        if env not in envs or (phase == "processes" and env not in PROCESS_SHARDS):
            continue
        shards = PROCESS_SHARDS[env] if phase == "processes" else 1
        jobs += [Job(env, phase, f"{k}/{shards}" if shards > 1 else "") for k in range(1, shards + 1)]
    start = time.monotonic()
    run_jobs(jobs, args.jobs, _tox(), ["--", *args.pytest_args] if args.pytest_args else [])
    print(f"\njob                      result   minutes   ({args.jobs} at a time)")
    for job in jobs:
        result = "ok" if job.code == 0 else "FAILED" if job.code is not None else "not run"
        print(f"{job.name:24} {result:8} {job.seconds / 60:6.1f}")
    print(f"{'total (wall)':24} {'':8} {(time.monotonic() - start) / 60:6.1f}")
    return 0 if all(job.code == 0 for job in jobs) else 1


if __name__ == "__main__":
    sys.exit(main())
