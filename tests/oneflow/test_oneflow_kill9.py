"""kill -9 at random moments on the oneflow backend, then resume: bit-identical to an uninterrupted run.

The child (``tests/core/_kill9_train.py --driver oneflow``) trains a small MLP with
dropout (whose generator oneflow keeps inside the module) and Adam from a
``oneflow.utils.data.DataLoader(shuffle=True)`` with gradient accumulation over 3
batches, checkpointing after every batch; ``bench/kill9_stress.py --driver oneflow``
is the long version.
"""

from __future__ import annotations

import os
import time

import pytest

pytest.importorskip("oneflow")

from ..core._kill9 import Delays, kill_rounds  # noqa: E402

os.environ.setdefault("GLOG_minloglevel", "2")

N_KILLS = 5


@pytest.mark.oneflow
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_oneflow_kill9_at_random_moments_then_resume_is_bit_exact(tmp_path):
    start = time.monotonic()
    tally = kill_rounds(str(tmp_path), N_KILLS, seed=7, driver="oneflow", delays=Delays(save=0.01, step=0.02),
                        max_kills_per_round=3, timeout=150)
    print(f"\nkill -9 (oneflow): {tally.summary()}; {time.monotonic() - start:.1f} s")
    assert tally.total_kills == N_KILLS
    assert tally.bit_exact_rounds == tally.rounds > 0
    assert len(tally.resumed_from) > 0, "no process resumed from a checkpoint; the test proved nothing"
    print("oneflow kill tally:", dict(tally.kills))
