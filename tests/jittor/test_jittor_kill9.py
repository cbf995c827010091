"""kill -9 at random moments on the jittor backend, then resume: bit-identical to an uninterrupted run.

The child (``tests/core/_kill9_train.py --driver jittor``) trains a small MLP with
dropout and Adam from a shuffled jittor Dataset with gradient accumulation,
checkpointing after every batch. So the resume covers the sampler position, Adam's
moments and step count, the gradients of an unfinished accumulation cycle and
jittor's random engine (dropout). Few kills because each process spends ~2 s
importing jittor.
"""

from __future__ import annotations

import time

import pytest

from ..core._kill9 import Delays, kill_rounds

N_KILLS = 4


@pytest.mark.jittor
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_jittor_kill9_at_random_moments_then_resume_is_bit_exact(tmp_path):
    start = time.monotonic()
    tally = kill_rounds(str(tmp_path), N_KILLS, seed=7, driver="jittor", delays=Delays(save=0.01, step=0.02),
                        max_kills_per_round=2, timeout=150)
    print(f"\nkill -9 (jittor): {tally.summary()}; {time.monotonic() - start:.1f} s")
    assert tally.total_kills == N_KILLS
    assert tally.bit_exact_rounds == tally.rounds > 0
    print("jittor kill tally:", dict(tally.kills))
