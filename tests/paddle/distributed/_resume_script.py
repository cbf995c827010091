"""The program test_resume_world_sizes.py starts under paddle's launcher (gloo on CPU), at 2 or 3 ranks:

    python -m paddle.distributed.launch --nproc_per_node W --log_dir LOGS _resume_script.py OUT PHASE[,PHASE...]

The phases and what each rank writes are those of ``_resume_rule.py``; here only the run they share:
a small MLP, SGD, ``_resume_rule.PER_RANK`` samples per rank and step from a shuffled set.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))

import numpy as np  # noqa: E402
import paddle  # noqa: E402
from paddle.io import DataLoader  # noqa: E402

from drivetrain import Trainer  # noqa: E402
from tests._resume_rule import N_SAMPLES, PER_RANK, main  # noqa: E402
from tests.paddle.distributed._dist_script import Points, make_net  # noqa: E402


def make_trainer(n_epochs: int, callbacks: list, **options) -> Trainer:
    model = make_net()
    np.random.seed(0)  # paddle's shuffling draws its seed from numpy's global generator
    loader = DataLoader(Points(N_SAMPLES, seed=0), batch_size=PER_RANK, shuffle=True)
    optimizer = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
    return Trainer(model, loader, optimizer, driver="paddle", n_epochs=n_epochs, callbacks=callbacks,
                   progress_bar=None, **options)


if __name__ == "__main__":
    main(sys.argv[1:], make_trainer, index_key="idx")
