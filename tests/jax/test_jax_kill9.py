"""kill -9 at random moments on the JAX backend, then resume: bit-identical to an uninterrupted run.

The child (``tests/core/_kill9_train.py --driver jax``) trains a flax NNX MLP with dropout and
``nnx.Optimizer`` over optax's Adam from shuffled numpy batches with gradient accumulation,
checkpointing after every batch. Few kills because each process spends seconds importing JAX and
compiling its step; ``bench/kill9_stress.py --driver jax`` is the long version (figures in
docs/reliability.md).
"""

from __future__ import annotations

import pytest

from ..core._kill9 import short_kill_test


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_jax_kill9_at_random_moments_then_resume_is_bit_exact(tmp_path):
    short_kill_test(str(tmp_path), 3, seed=5, driver="jax", timeout=150)
