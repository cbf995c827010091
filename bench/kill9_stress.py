"""kill -9 stress: many SIGKILLs at random moments, each followed by a resume; the end must be bit-exact.

The long version of the ``test_*kill9*`` tests of every engine: the child ``tests/core/_kill9_train.py``
trains a fixed problem (``tests/core/_kill9_models.py``: an MLP with dropout and Adam on shuffled data,
gradient accumulation over 3 batches, 3 epochs), writing a checkpoint after every batch with a
``CheckpointCallback`` that keeps the newest two. Rounds of: start from scratch, SIGKILL after a random
delay, ``--resume`` (sometimes killed again, also while it is still loading), ..., resume to the end;
compare every tensor of the final checkpoint with an uninterrupted run's byte for byte. After every kill
each checkpoint folder under its real name must verify. With ``--nproc 2`` the Trainer starts the second
rank (jittor: ``mpirun -np 2``); a kill hits one random rank or the whole job, and the other ranks must
end by themselves within ``--watchdog-bound`` seconds.

    python bench/kill9_stress.py [--kills 200] [--driver numpy|torch|torch_fsdp|deepspeed|paddle|oneflow|jittor|jax]
                                 [--nproc 1|2] [--seed 0] [--save-delay S] [--step-delay S] [--minutes M]
                                 [--checkpoint-kwargs '{"background": true}'] [--keep DIR] [-v]

Run it with the Python of the engine's environment (``.tox/torch/bin/python`` ...). Where each kill landed
is told from what it left behind (see tests/core/_kill9.py): a new ``.tmp-step-...`` folder = during a
save, ``.tmp-del-...`` = while deleting an old checkpoint, no ``begin`` line from a ``--resume`` process =
during the resume.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tests.core._kill9 import CHECKPOINT_KWARGS_ENV, Delays, Kill9Failure, Tally, kill_rounds  # noqa: E402 - needs ROOT
from tests.core._kill9_models import BUILDERS  # noqa: E402 - needs ROOT on sys.path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=200)
    parser.add_argument("--driver", choices=sorted(BUILDERS), default="numpy")
    parser.add_argument("--nproc", type=int, default=1, help="processes of the job (2: the Trainer starts the "
                        "second; jittor: mpirun -np 2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--save-delay", type=float, default=None,
                        help="sleep before each file a save writes (default 0.003 numpy, 0.01 the others)")
    parser.add_argument("--step-delay", type=float, default=None,
                        help="sleep per batch, standing in for compute (default 0.006 numpy, 0.02 the others)")
    parser.add_argument("--max-kills-per-round", type=int, default=4)
    parser.add_argument("--minutes", type=float, default=None, help="stop starting rounds after this long")
    parser.add_argument("--watchdog-bound", type=float, default=40.0,
                        help="seconds the other ranks may take to end after one rank's kill")
    parser.add_argument("--checkpoint-kwargs", default=None,
                        help="a JSON dict of extra CheckpointCallback arguments, e.g. '{\"background\": true}'")
    parser.add_argument("--keep", help="work in this folder and keep it (default: a temp folder, removed)")
    parser.add_argument("-v", "--verbose", action="store_true", help="print every kill")
    args = parser.parse_args()
    if args.checkpoint_kwargs is not None:
        if not isinstance(json.loads(args.checkpoint_kwargs), dict):
            parser.error(f"--checkpoint-kwargs {args.checkpoint_kwargs!r} is not a JSON object")
        os.environ[CHECKPOINT_KWARGS_ENV] = args.checkpoint_kwargs  # the child reads it
    numpy_run = args.driver == "numpy"
    delays = Delays(save=args.save_delay if args.save_delay is not None else (0.003 if numpy_run else 0.01),
                    step=args.step_delay if args.step_delay is not None else (0.006 if numpy_run else 0.02))
    workdir = args.keep or tempfile.mkdtemp(prefix="drivetrain-kill9-")
    os.makedirs(workdir, exist_ok=True)
    engine = args.driver if args.nproc == 1 else f"{args.driver} x{args.nproc}"
    print(f"kill -9 stress: {args.kills} kills, {engine}, seed={args.seed}, save delay {delays.save * 1e3:g} "
          f"ms/file, step delay {delays.step * 1e3:g} ms/batch, checkpoint kwargs "
          f"{os.environ.get(CHECKPOINT_KWARGS_ENV) or '{}'}, in {workdir}")
    print(f"python {platform.python_version()} on {platform.platform()}, {os.cpu_count()} CPUs, "
          f"started {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    start = time.monotonic()
    deadline = start + args.minutes * 60 if args.minutes else None
    tally = Tally()
    failure = None
    try:
        kill_rounds(workdir, args.kills, seed=args.seed, driver=args.driver, nproc=args.nproc, delays=delays,
                    max_kills_per_round=args.max_kills_per_round, timeout=60 if numpy_run else 240,
                    deadline=deadline, watchdog_bound=args.watchdog_bound, tally=tally,
                    log=print if args.verbose else None)
    except Kill9Failure as exc:
        failure = exc
    wall = time.monotonic() - start
    if not args.keep and failure is None:
        shutil.rmtree(workdir, ignore_errors=True)
    print()
    print(f"{'kills':<44}{tally.total_kills:>6}")
    print(f"{'  during a save (temp folder left behind)':<44}{tally.landed('save'):>6}")
    print(f"{'  during deletion of an old checkpoint':<44}{tally.landed('rotation'):>6}")
    print(f"{'  during training, between saves':<44}{tally.landed('training'):>6}")
    print(f"{'  during a resume (before its first batch)':<44}{tally.kills['resume']:>6}")
    print(f"{'  during start-up of a fresh run':<44}{tally.kills['startup']:>6}")
    print(f"{'  of which hit a resumed process':<44}{tally.resume_kills:>6}")
    for target, count in sorted(tally.targets.items()) if args.nproc > 1 else ():
        print(f"{'  of which hit ' + ('the whole job' if target == 'job' else target):<44}{count:>6}")
    if tally.survivors_ended:
        print(f"{'  other ranks ended after a rank kill, max':<44}{max(tally.survivors_ended):>5.1f}s")
    print(f"{'kills due after the process had finished':<44}{tally.missed:>6}")
    print(f"{'rounds (from scratch to the end)':<44}{tally.rounds:>6}")
    print(f"{'processes started (besides the reference run)':<44}{tally.processes:>6}")
    print(f"{'checkpoint folders verified after kills':<44}{tally.checkpoints_verified:>6}")
    print(f"{'rounds bit-exact':<44}{tally.bit_exact_rounds:>6}")
    print(f"{'wall time':<44}{wall:>5.0f}s")
    if failure is not None:
        print(f"FAILED after {wall:.1f} s: {failure}\n(work folder kept: {workdir})")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
