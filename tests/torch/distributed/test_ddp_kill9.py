"""kill -9 in a 2-rank DDP job (``Trainer(nproc=2)``), then resume: bit-identical to an uninterrupted run.

The short version of ``bench/kill9_stress.py --driver torch --nproc 2``, with one kill (each start of two
ranks costs seconds, and the suite's time counts; the stress run's figures are in docs/reliability.md):
rank 0, which also started and watches rank 1, is killed while both train. Rank 1 must end by itself within
the bound (the watchdog, ``torch_kwargs={"timeout": 10}``), every checkpoint under its real name must verify,
and the resume must end with a checkpoint whose every tensor equals the uninterrupted run's.
"""

from __future__ import annotations

import pytest

from ...core._kill9 import short_kill_test

pytestmark = [pytest.mark.distributed, pytest.mark.torch, pytest.mark.slow]
SUITE_SECONDS = 35  # seconds, measured alone (tests/conftest.py splits the process tests into shards by it)


@pytest.mark.timeout(240)
def test_ddp_kill9_of_a_rank_then_resume_is_bit_exact(tmp_path) -> None:
    short_kill_test(str(tmp_path), 1, seed=6, driver="torch", nproc=2, max_kills_per_round=1)  # seed 6: rank 0, mid-run
