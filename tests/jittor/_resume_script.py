"""The program test_resume_world_sizes.py starts under ``mpirun -np W`` (jittor's MPI, CPU), at 2 or 3 processes:

    mpirun -np W python _resume_script.py OUT PHASE[,PHASE...]

The phases and what each rank writes are those of ``tests/paddle/distributed/_resume_rule.py`` (framework-free);
here only the run they share: the TinyNet, SGD, ``PER_RANK`` samples per process and step, shuffled. jittor's
``batch_size`` is the global batch under MPI, so it is ``PER_RANK`` x the processes (the per-process batch
stays the same at every world size, as a checkpoint's sampler requires).
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from drivetrain_jittor import import_jittor  # noqa: E402

jt = import_jittor()

from drivetrain import Trainer, seed_everything  # noqa: E402
from tests._resume_rule import N_SAMPLES, main  # noqa: E402
from tests.jittor.conftest import Points, TinyNet  # noqa: E402

PER_RANK = 2


def make_trainer(n_epochs: int, callbacks: list, **options) -> Trainer:
    seed_everything(0)
    model = TinyNet()
    data = Points(N_SAMPLES, batch_size=PER_RANK * int(jt.world_size), shuffle=True)
    return Trainer(model, data, jt.optim.SGD(model.parameters(), lr=0.1), driver="jittor", device="cpu",
                   n_epochs=n_epochs, callbacks=callbacks, progress_bar=None, **options)


if __name__ == "__main__":
    main(sys.argv[1:], make_trainer, index_key="index")
