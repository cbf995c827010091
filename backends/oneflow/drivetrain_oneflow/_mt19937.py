"""The Mersenne Twister arithmetic needed to save oneflow 0.9's CPU generators exactly.

oneflow's CPU generator is a ``std::mt19937``. Its ``get_state`` writes the 624 state
words but drops the engine's read position, and ``set_state`` restarts at a block
boundary (the next draw twists the words first). :func:`untwist` gives the words one
twist *before* a block, so that restoring them and drawing ``position`` words lands
exactly where the saved engine was. :func:`temper` turns state words into the values
the engine outputs, which is how the position is found (see ``_rng.py``).
"""

from __future__ import annotations

import numpy as np

N, M = 624, 397
_MATRIX_A, _UPPER, _LOWER, _MASK = 0x9908B0DF, 0x80000000, 0x7FFFFFFF, 0xFFFFFFFF


def temper(words: np.ndarray) -> np.ndarray:
    """What the engine outputs for each state word (uint64 array of 32-bit values)."""
    y = np.asarray(words, dtype=np.uint64) & np.uint64(_MASK)
    y ^= y >> np.uint64(11)
    y ^= (y << np.uint64(7)) & np.uint64(0x9D2C5680)
    y ^= (y << np.uint64(15)) & np.uint64(0xEFC60000)
    y ^= y >> np.uint64(18)
    return y & np.uint64(_MASK)


def twist(words: np.ndarray) -> np.ndarray:
    """The next block of state words (the engine's in-place regeneration, done on a copy)."""
    x = [int(v) for v in words]
    for k in range(N):
        y = (x[k] & _UPPER) | (x[(k + 1) % N] & _LOWER)
        x[k] = x[(k + M) % N] ^ (y >> 1) ^ (_MATRIX_A if y & 1 else 0)
    return np.array(x, dtype=np.uint64)


def untwist(words: np.ndarray) -> np.ndarray:
    """Words that :func:`twist` turns into ``words`` (which must come from a twist, as engine states do).

    Walks the regeneration backwards: each new word, XOR the word it was mixed with, tells
    the upper bit of the old word at its index and the lower 31 bits of the next one. The
    lower bits of old word 0 never reach the output, so they are left at 0.
    """
    new = [int(v) for v in words]
    old = [0] * N
    for k in range(N - 1, -1, -1):
        mixed = new[k + M - N] if k + M >= N else old[k + M]
        shifted = new[k] ^ mixed
        y = (((shifted ^ _MATRIX_A) << 1) | 1) if shifted & _UPPER else (shifted << 1)
        y &= _MASK
        old[k] = (old[k] & _LOWER) | (y & _UPPER)
        if k + 1 < N:
            old[k + 1] = (old[k + 1] & _UPPER) | (y & _LOWER)
    return np.array(old, dtype=np.uint64)
