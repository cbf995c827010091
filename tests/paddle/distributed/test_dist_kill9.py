"""kill -9 in a 2-rank paddle DataParallel job (``Trainer(nproc=2)``), then resume: bit-identical.

The short version of ``bench/kill9_stress.py --driver paddle --nproc 2``, with one kill (the suite's time
counts; the stress run's figures are in docs/reliability.md): rank 1 is killed while both train. Rank 0 must
end by itself within the bound (the watchdog, ``paddle_kwargs={"timeout": 10}``; paddle's gloo alone would
wait 30 s), every checkpoint under its real name must verify, and the resume must end with a checkpoint whose
every tensor equals the uninterrupted run's.
"""

from __future__ import annotations

import pytest

from ...core._kill9 import short_kill_test

pytestmark = [pytest.mark.distributed, pytest.mark.paddle, pytest.mark.slow]


@pytest.mark.timeout(240)
def test_paddle_dist_kill9_of_a_rank_then_resume_is_bit_exact(tmp_path) -> None:
    short_kill_test(str(tmp_path), 1, seed=0, driver="paddle", nproc=2, max_kills_per_round=1)  # seed 0: rank 1, mid-run
