"""kill -9 at random moments on the paddle backend, then resume: bit-identical to an uninterrupted run.

The child (``tests/core/_kill9_train.py --driver paddle``) trains a small MLP with
dropout and Adam from a ``paddle.io.DataLoader(shuffle=True)`` with gradient
accumulation, checkpointing after every batch. Every resumed process rebuilds the
model, so its parameters get new global names (``linear_2.w_0`` ...) -- the
checkpoint must not depend on them.
"""

from __future__ import annotations

import os
import time

import pytest

from ..core._kill9 import Delays, kill_rounds

os.environ.setdefault("OMP_NUM_THREADS", "1")

N_KILLS = 5


@pytest.mark.paddle
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_paddle_kill9_at_random_moments_then_resume_is_bit_exact(tmp_path):
    start = time.monotonic()
    tally = kill_rounds(str(tmp_path), N_KILLS, seed=11, driver="paddle", delays=Delays(save=0.01, step=0.02),
                        max_kills_per_round=3, timeout=120)
    print(f"\nkill -9 (paddle): {tally.summary()}; {time.monotonic() - start:.1f} s")
    assert tally.total_kills == N_KILLS
    assert tally.bit_exact_rounds == tally.rounds > 0
    assert tally.landed("save") >= 1, tally.kills
