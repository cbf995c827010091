"""kill -9 stress: many SIGKILLs at random moments, each followed by a resume; the end must be bit-exact.

The long version of ``tests/core/test_kill9.py``: the child ``tests/core/_kill9_train.py``
trains a fixed problem (shuffled data, random noise / dropout, gradient accumulation
over 3 batches, 3 epochs), writing a checkpoint after every batch and deleting all
but the newest two. Rounds of: start from scratch, SIGKILL after a random delay,
``--resume`` (sometimes killed again, also while it is still loading), ..., resume
to the end; compare the final parameters with an uninterrupted run byte for byte.
After every kill each checkpoint folder under its real name must verify.

    python bench/kill9_stress.py [--kills 200] [--driver numpy|torch] [--seed 0]
                                 [--save-delay S] [--step-delay S] [--keep DIR]

Where each kill landed is told from what it left behind (see tests/core/_kill9.py):
a new ``.tmp-step-...`` folder = during a save, ``.tmp-del-...`` = while deleting an
old checkpoint, no ``begin`` line from a ``--resume`` process = during the resume.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tests.core._kill9 import Delays, Kill9Failure, kill_rounds  # noqa: E402 - needs ROOT on sys.path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=200)
    parser.add_argument("--driver", choices=("numpy", "torch"), default="numpy")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--save-delay", type=float, default=None,
                        help="sleep before each file a save writes (default 0.003 numpy, 0.01 torch)")
    parser.add_argument("--step-delay", type=float, default=None,
                        help="sleep per batch, standing in for compute (default 0.006 numpy, 0.02 torch)")
    parser.add_argument("--max-kills-per-round", type=int, default=4)
    parser.add_argument("--keep", help="work in this folder and keep it (default: a temp folder, removed)")
    parser.add_argument("-v", "--verbose", action="store_true", help="print every kill")
    args = parser.parse_args()
    torch_run = args.driver == "torch"
    delays = Delays(save=args.save_delay if args.save_delay is not None else (0.01 if torch_run else 0.003),
                    step=args.step_delay if args.step_delay is not None else (0.02 if torch_run else 0.006))
    workdir = args.keep or tempfile.mkdtemp(prefix="drivetrain-kill9-")
    os.makedirs(workdir, exist_ok=True)
    print(f"kill -9 stress: {args.kills} kills, driver={args.driver}, seed={args.seed}, save delay "
          f"{delays.save * 1e3:g} ms/file, step delay {delays.step * 1e3:g} ms/batch, in {workdir}")
    print(f"python {platform.python_version()} on {platform.platform()}, {os.cpu_count()} CPUs")
    start = time.monotonic()
    failure = None
    try:
        tally = kill_rounds(workdir, args.kills, seed=args.seed, driver=args.driver, delays=delays,
                            max_kills_per_round=args.max_kills_per_round, timeout=120 if torch_run else 60,
                            log=print if args.verbose else None)
    except Kill9Failure as exc:
        failure = exc
    wall = time.monotonic() - start
    if not args.keep and failure is None:
        shutil.rmtree(workdir, ignore_errors=True)
    if failure is not None:
        print(f"FAILED after {wall:.1f} s: {failure}\n(work folder kept: {workdir})")
        return 1
    print()
    print(f"{'kills':<44}{tally.total_kills:>6}")
    print(f"{'  during a save (temp folder left behind)':<44}{tally.landed('save'):>6}")
    print(f"{'  during deletion of an old checkpoint':<44}{tally.landed('rotation'):>6}")
    print(f"{'  during training, between saves':<44}{tally.landed('training'):>6}")
    print(f"{'  during a resume (before its first batch)':<44}{tally.kills['resume']:>6}")
    print(f"{'  during start-up of a fresh run':<44}{tally.kills['startup']:>6}")
    print(f"{'  of which hit a resumed process':<44}{tally.resume_kills:>6}")
    print(f"{'kills due after the process had finished':<44}{tally.missed:>6}")
    print(f"{'rounds (from scratch to the end)':<44}{tally.rounds:>6}")
    print(f"{'processes started (besides the reference run)':<44}{tally.processes:>6}")
    print(f"{'checkpoint folders verified after kills':<44}{tally.checkpoints_verified:>6}")
    print(f"{'all final parameters bit-exact':<44}{'yes' if tally.bit_exact_rounds == tally.rounds else 'NO':>6}")
    print(f"{'wall time':<44}{wall:>5.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
