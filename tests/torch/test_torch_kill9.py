"""kill -9 at random moments on the torch backend, then resume: bit-identical to an uninterrupted run.

The child (``tests/core/_kill9_train.py --driver torch``) trains a small MLP with
dropout and Adam from a ``DataLoader(shuffle=True)`` with gradient accumulation,
checkpointing after every batch. Fewer kills than the numpy version because each
process spends ~1.5 s importing torch; ``bench/kill9_stress.py --driver torch`` is
the long version (figures in docs/reliability.md).
"""

from __future__ import annotations

import os

import pytest

from ..core._kill9 import short_kill_test

os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_torch_kill9_at_random_moments_then_resume_is_bit_exact(tmp_path):
    short_kill_test(str(tmp_path), 3, seed=5, driver="torch")
