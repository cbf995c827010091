"""The program tests/jax/distributed/test_slurm.py starts: ``python _slurm_script.py OUT [--nproc 2]``.

The training of ``_jax_script.py`` (an MLP with a layer norm, 8 samples per rank and step, accumulation over 2
batches, 2 epochs) with ``nproc=2`` (the Trainer's two workers) or, without it, as a task of ``srun -n 2``. Each
start of the program appends its pid to ``OUT/began.txt`` (a task of srun starts twice: it builds the model, then
runs itself again under ``drivetrain_jax.run`` in the same process); each rank writes ``OUT/rank-<r>.json`` (rank,
world size, pid) and rank 0 the final state to ``OUT/final.npz``.
"""

from __future__ import annotations

import json
import os
import sys

from _jax_script import PER_RANK, save, trainer

if __name__ == "__main__":
    out = sys.argv[1]
    with open(os.path.join(out, "began.txt"), "a") as f:
        f.write(f"{os.getpid()}\n")
    t = trainer(PER_RANK, nproc=2 if sys.argv[2:] == ["--nproc", "2"] else None)
    t.run()
    save(out, "final.npz", t)
    with open(os.path.join(out, f"rank-{t.driver.rank}.json"), "w") as f:
        json.dump({"rank": t.driver.rank, "world_size": t.driver.world_size, "pid": os.getpid()}, f)
