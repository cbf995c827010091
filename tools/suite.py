"""Run the whole test suite the quick way: what CI runs (`.ci/run`) and the README's test command.

Two phases over the tox envs of ``tox.ini``:

1. ``local``: every env's tests but those marked ``distributed``, two envs at a time
   (``tox run-parallel -p 2``): one env's installs and jittor's compile overlap another's
   tests, and a 2-core machine runs two single-process test sessions at full speed.
2. ``processes``: the tests marked ``distributed`` (they start several processes, and some
   bound how long a failing rank takes to stop the others), two envs at a time as well: torch's
   take as long as the other envs' together, and these tests spend most of their time waiting
   (measured: paddle's used 98 s of CPU in 247 s), so a second env fits beside torch. The bounds
   they check hold at a load of 8 on this 2-core machine. The envs are built already, so this
   phase installs nothing.

``tests/conftest.py`` selects each phase's tests from ``DRIVETRAIN_TEST_PHASE``. Usage::

    python tools/suite.py                    # everything (needs tox on PATH or beside this python)
    python tools/suite.py -e torch,core      # some envs only
    python tools/suite.py --serial           # each phase one env at a time (slower; for a loaded machine)
    python tools/suite.py -- -x -k resume    # arguments after -- go to every pytest

It prints how long each phase took and exits non-zero if any env failed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ORDER = ("jittor", "torch", "oneflow", "paddle", "jax", "docs", "core", "third_party", "lint")
"""Phase 1's start order: the longest envs first, so the short ones fill the gaps at the end."""
WITH_PROCESS_TESTS = ("torch", "paddle", "jittor", "oneflow", "jax")
"""The envs whose tests include some marked ``distributed`` (phase 2 runs only these)."""


def _tox() -> list[str]:
    beside = Path(sys.executable).with_name("tox")
    found = str(beside) if beside.exists() else shutil.which("tox")
    if found is None:
        sys.exit("tools/suite.py needs tox: python3 -m venv .venv-tox && .venv-tox/bin/pip install 'tox>=4', "
                 "then run .venv-tox/bin/python tools/suite.py")
    return [found]


def _run(label: str, command: list[str], phase: str) -> tuple[int, float]:
    print(f"\n=== {label}: {' '.join(command)}", flush=True)
    start = time.monotonic()
    code = subprocess.call(command, cwd=ROOT, env={**os.environ, "DRIVETRAIN_TEST_PHASE": phase})
    seconds = time.monotonic() - start
    print(f"=== {label}: {'ok' if code == 0 else f'FAILED (exit {code})'} in {seconds / 60:.1f} min", flush=True)
    return code, seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-e", "--envs", default=",".join(ORDER), help="comma-separated tox envs (default: all)")
    parser.add_argument("--serial", action="store_true", help="each phase one env at a time")
    parser.add_argument("pytest_args", nargs="*", help="passed to every pytest (after --)")
    args = parser.parse_args(argv)
    envs = [env for env in args.envs.split(",") if env]
    unknown = sorted(set(envs) - set(ORDER))
    if unknown:
        parser.error(f"--envs: {', '.join(unknown)} is not an env of tox.ini; choose from {', '.join(ORDER)}")
    envs.sort(key=ORDER.index)
    tox, extra = _tox(), (["--", *args.pytest_args] if args.pytest_args else [])
    parallel = [] if args.serial or len(envs) == 1 else ["run-parallel", "-p", "2", "--parallel-no-spinner"]
    results = [("local tests" + ("" if args.serial else ", 2 envs at a time"),
                _run("phase 1", [*tox, *parallel, "-e", ",".join(envs), *extra], "local"))]
    processes = [env for env in envs if env in WITH_PROCESS_TESTS]
    if processes:
        together = [] if args.serial or len(processes) == 1 else parallel
        results.append(("process tests" + ("" if not together else ", 2 envs at a time"),
                        _run("phase 2", [*tox, *together, "-e", ",".join(processes), *extra], "processes")))
    print("\nphase                                    result   minutes")
    for label, (code, seconds) in results:
        print(f"{label:40} {'ok' if code == 0 else 'FAILED':8} {seconds / 60:6.1f}")
    print(f"{'total':40} {'':8} {sum(seconds for _, (_, seconds) in results) / 60:6.1f}")
    return 0 if all(code == 0 for _, (code, _) in results) else 1


if __name__ == "__main__":
    sys.exit(main())
