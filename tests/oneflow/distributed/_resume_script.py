"""The program test_resume_world_sizes.py starts under oneflow's launcher (CPU), at 2 or 3 ranks:

    python -m oneflow.distributed.launch --nproc_per_node W --master_port P _resume_script.py OUT PHASE[,PHASE...]

The phases and what each rank writes are those of ``tests/paddle/distributed/_resume_rule.py`` (framework-free);
here only the run they share: ``_ddp_script``'s MLP, SGD, ``PER_RANK`` samples per rank and step, shuffled.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("GLOG_minloglevel", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))

import oneflow as flow  # noqa: E402

from drivetrain import Trainer  # noqa: E402
from tests._resume_rule import N_SAMPLES, PER_RANK, main  # noqa: E402
from tests.oneflow.distributed._ddp_script import Net, Points  # noqa: E402


def make_trainer(n_epochs: int, callbacks: list, **options) -> Trainer:
    model = Net()
    shuffling = flow.Generator()
    shuffling.manual_seed(5)
    loader = flow.utils.data.DataLoader(Points(N_SAMPLES, 0), batch_size=PER_RANK, shuffle=True, generator=shuffling)
    return Trainer(model, loader, flow.optim.SGD(model.parameters(), lr=0.1), driver="oneflow", device="cpu",
                   n_epochs=n_epochs, callbacks=callbacks, progress_bar=None, **options)


if __name__ == "__main__":
    main(sys.argv[1:], make_trainer, index_key="idx")
