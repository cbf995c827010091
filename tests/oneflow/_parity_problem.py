"""The fixed problem of the oneflow/torch parity test, in numpy only (importable by both environments).

An MLP 8 -> 32 -> 3 (tanh) with cross-entropy, plain SGD (lr 0.1), 100 steps of 16
samples; weights and data come from numpy's PCG64 with fixed seeds, so torch (Python
3.11) and oneflow (Python 3.10) start from the very same numbers.
"""

from __future__ import annotations

import numpy as np

STEPS = 100
BATCH = 16
SIZES = (8, 32, 3)
LR = 0.1
REFERENCE = "torch_reference.npz"


def initial_weights() -> dict[str, np.ndarray]:
    """``{"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}`` in the (out, in) layout both frameworks use."""
    rng = np.random.default_rng(2024)
    n_in, hidden, n_out = SIZES
    return {
        "fc1.weight": (rng.standard_normal((hidden, n_in)) / np.sqrt(n_in)).astype(np.float32),
        "fc1.bias": (rng.standard_normal(hidden) * 0.1).astype(np.float32),
        "fc2.weight": (rng.standard_normal((n_out, hidden)) / np.sqrt(hidden)).astype(np.float32),
        "fc2.bias": np.zeros(n_out, np.float32),
    }


def batches() -> list[dict[str, np.ndarray]]:
    """``STEPS`` batches of ``{"x": float32 [BATCH, 8], "y": int64 [BATCH]}`` from a fixed linear rule."""
    rng = np.random.default_rng(7)
    rule = rng.standard_normal((SIZES[0], SIZES[2]))
    out = []
    for _ in range(STEPS):
        x = rng.standard_normal((BATCH, SIZES[0])).astype(np.float32)
        out.append({"x": x, "y": (x @ rule).argmax(1).astype(np.int64)})
    return out
