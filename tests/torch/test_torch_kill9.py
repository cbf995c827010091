"""kill -9 at random moments on the torch backend, then resume: bit-identical to an uninterrupted run.

The child (``tests/core/_kill9_train.py --driver torch``) trains a small MLP with
dropout and Adam from a ``DataLoader(shuffle=True)`` with gradient accumulation,
checkpointing after every batch. Fewer kills than the numpy version because each
process spends ~1.5 s importing torch; ``bench/kill9_stress.py --driver torch`` is
the long version.
"""

from __future__ import annotations

import inspect
import os
import time

import pytest

from ..core._kill9 import Delays, kill_rounds

os.environ.setdefault("OMP_NUM_THREADS", "1")

N_KILLS = 5


def _torch_driver_checkpoints() -> bool:
    driver = pytest.importorskip("drivetrain_torch.driver")
    return not inspect.isabstract(driver.TorchSingleDriver)


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_torch_kill9_at_random_moments_then_resume_is_bit_exact(tmp_path):
    if not _torch_driver_checkpoints():
        pytest.skip("the torch driver does not implement the checkpoint state methods yet (TorchSingleDriver is abstract)")
    start = time.monotonic()
    tally = kill_rounds(str(tmp_path), N_KILLS, seed=7, driver="torch", delays=Delays(save=0.01, step=0.02),
                        max_kills_per_round=3, timeout=120)
    print(f"\nkill -9 (torch): {tally.summary()}; {time.monotonic() - start:.1f} s")
    assert tally.total_kills == N_KILLS
    assert tally.bit_exact_rounds == tally.rounds > 0
    # Where 5 random kills land depends on the machine's load; kills inside saves are asserted
    # by the 20-kill numpy test (the folder format is the core's). Here the tally is reported.
    print("torch kill tally:", dict(tally.kills))
