"""Run the whole test suite the quick way: what CI runs (`.ci/run`) and the README's test command.

Each tox env of ``tox.ini`` gives one or two jobs: ``local`` (every test not marked ``distributed``)
and, for the backends, ``processes`` (the tests marked ``distributed``: they start several
processes through launchers, ``nproc=`` or ``mpirun``). ``tests/conftest.py`` selects a job's tests
from ``DRIVETRAIN_TEST_PHASE``. The jobs run three at a time, in the order of :data:`PRIORITY`:

- an env's ``processes`` job starts only once its ``local`` job has ended (tox builds the env once,
  never two tox runs in one env at a time);
- torch's process tests take as long as the local tests of every env together, so torch's two jobs
  come first and the rest fill the other slots around them;
- the process tests spend most of their time waiting for processes to start, meet and stop (paddle's
  used 98 s of CPU in 247 s), which is why a third job pays on 2 cores; at most two ``processes``
  jobs run at once, and the time bounds they check (a failing rank stops the others, Ctrl-C ends
  every rank) held at a load of 8 on this 2-core machine.

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
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENVS = ("core", "torch", "paddle", "jittor", "oneflow", "jax", "third_party", "lint", "docs")
"""Every env of tox.ini."""
WITH_PROCESS_TESTS = ("torch", "paddle", "jittor", "oneflow", "jax")
"""The envs whose tests include some marked ``distributed`` (the others have a ``local`` job only)."""
PRIORITY = ("torch:local", "torch:processes", "jax:local", "core:local", "jittor:local", "oneflow:local",
            "docs:local", "paddle:local", "paddle:processes", "oneflow:processes", "jittor:processes",
            "jax:processes", "third_party:local", "lint:local")
"""Start order when a slot is free: the critical path (torch's process tests) first, the longest next, the
short ones last to fill the gaps at the end."""
MAX_PROCESS_JOBS = 2
LOGS = ROOT / ".tox" / "suite-logs"


@dataclass
class Job:
    env: str
    phase: str  # "local" or "processes"
    log: Path = field(init=False)
    process: subprocess.Popen | None = None
    started: float = 0.0
    seconds: float = 0.0
    code: int | None = None

    def __post_init__(self) -> None:
        self.log = LOGS / f"{self.env}-{self.phase}.log"

    @property
    def name(self) -> str:
        return f"{self.env}:{self.phase}"


def _tox() -> str:
    beside = Path(sys.executable).with_name("tox")
    found = str(beside) if beside.exists() else shutil.which("tox")
    if found is None:
        sys.exit("tools/suite.py needs tox: python3 -m venv .venv-tox && .venv-tox/bin/pip install 'tox>=4', "
                 "then run .venv-tox/bin/python tools/suite.py")
    return found


def _start(job: Job, tox: str, extra: list[str], t0: float) -> None:
    command = [tox, "run", "-e", job.env, *extra]
    print(f"[{(time.monotonic() - t0) / 60:5.1f} min] start {job.name}: {' '.join(command)}", flush=True)
    out = job.log.open("w")
    job.process = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, env={**os.environ, "DRIVETRAIN_TEST_PHASE": job.phase})
    out.close()
    job.started = time.monotonic()


def _finish(job: Job, code: int, t0: float) -> None:
    job.code, job.seconds = code, time.monotonic() - job.started
    verdict = "ok" if code == 0 else f"FAILED (exit {code})"
    print(f"\n===== {job.name}: {verdict} in {job.seconds / 60:.1f} min (output below, also in {job.log})",
          flush=True)
    sys.stdout.write(job.log.read_text(errors="replace"))
    print(f"===== [{(time.monotonic() - t0) / 60:5.1f} min] end of {job.name}: {verdict}\n", flush=True)


def _next(waiting: list[Job], running: list[Job], done: set[str]) -> Job | None:
    busy_envs = {job.env for job in running}
    processes = sum(job.phase == "processes" for job in running)
    for job in waiting:
        if job.env in busy_envs or (job.phase == "processes" and processes >= MAX_PROCESS_JOBS):
            continue
        if job.phase == "processes" and f"{job.env}:local" not in done:
            continue
        return job
    return None


def run_jobs(jobs: list[Job], slots: int, tox: str, extra: list[str]) -> None:
    """Run ``jobs`` at most ``slots`` at a time under the rules of the module docstring."""
    LOGS.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    waiting, running, done = list(jobs), [], set()
    while waiting or running:
        while len(running) < slots and (job := _next(waiting, running, done)) is not None:
            waiting.remove(job)
            _start(job, tox, extra, t0)
            running.append(job)
        time.sleep(0.5)
        for job in list(running):
            code = job.process.poll() if job.process else 0
            if code is not None:
                running.remove(job)
                done.add(job.name)
                _finish(job, code, t0)
        if not running and waiting and _next(waiting, running, done) is None:
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
    wanted = {f"{env}:local" for env in envs} | {f"{env}:processes" for env in envs if env in WITH_PROCESS_TESTS}
    jobs = [Job(*name.split(":")) for name in PRIORITY if name in wanted]
    start = time.monotonic()
    run_jobs(jobs, args.jobs, _tox(), ["--", *args.pytest_args] if args.pytest_args else [])
    print(f"\njob                    result   minutes   ({args.jobs} at a time)")
    for job in jobs:
        result = "ok" if job.code == 0 else "FAILED" if job.code is not None else "not run"
        print(f"{job.name:22} {result:8} {job.seconds / 60:6.1f}")
    print(f"{'total (wall)':22} {'':8} {(time.monotonic() - start) / 60:6.1f}")
    return 0 if all(job.code == 0 for job in jobs) else 1


if __name__ == "__main__":
    sys.exit(main())
