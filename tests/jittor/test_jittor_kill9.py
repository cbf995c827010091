"""kill -9 at random moments on the jittor backend, then resume: bit-identical to an uninterrupted run.

The child (``tests/core/_kill9_train.py --driver jittor``) trains a small MLP with
dropout and Adam from a shuffled jittor Dataset with gradient accumulation,
checkpointing after every batch. So the resume covers the sampler position, Adam's
moments and step count, the gradients of an unfinished accumulation cycle and
jittor's random engine (dropout). Few kills because each process spends ~2 s
importing jittor; ``bench/kill9_stress.py --driver jittor`` is the long version
(figures in docs/reliability.md).
"""

from __future__ import annotations

import pytest

from ..core._kill9 import short_kill_test


@pytest.mark.jittor
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_jittor_kill9_at_random_moments_then_resume_is_bit_exact(tmp_path):
    short_kill_test(str(tmp_path), 3, seed=5, driver="jittor", timeout=150)
