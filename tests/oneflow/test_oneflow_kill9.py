"""kill -9 at random moments on the oneflow backend, then resume: bit-identical to an uninterrupted run.

The child (``tests/core/_kill9_train.py --driver oneflow``) trains a small MLP with
dropout (whose generator oneflow keeps inside the module) and Adam from a
``oneflow.utils.data.DataLoader(shuffle=True)`` with gradient accumulation over 3
batches, checkpointing after every batch; ``bench/kill9_stress.py --driver oneflow``
is the long version (figures in docs/reliability.md).
"""

from __future__ import annotations

import pytest

pytest.importorskip("oneflow")

from ..core._kill9 import short_kill_test  # noqa: E402


@pytest.mark.oneflow
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_oneflow_kill9_at_random_moments_then_resume_is_bit_exact(tmp_path):
    short_kill_test(str(tmp_path), 3, seed=5, driver="oneflow", timeout=150)
