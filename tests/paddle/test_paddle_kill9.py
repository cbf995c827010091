"""kill -9 at random moments on the paddle backend, then resume: bit-identical to an uninterrupted run.

The child (``tests/core/_kill9_train.py --driver paddle``) trains a small MLP with
dropout and Adam from a ``paddle.io.DataLoader(shuffle=True)`` with gradient
accumulation, checkpointing after every batch. Every resumed process rebuilds the
model, so its parameters get new global names (``linear_2.w_0`` ...) -- the
checkpoint must not depend on them. ``bench/kill9_stress.py --driver paddle`` is the
long version (figures in docs/reliability.md).
"""

from __future__ import annotations

import pytest

from ..core._kill9 import short_kill_test


@pytest.mark.paddle
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_paddle_kill9_at_random_moments_then_resume_is_bit_exact(tmp_path):
    short_kill_test(str(tmp_path), 3, seed=5, driver="paddle")
