"""``CheckpointCallback(background=True)`` with 2 real ranks (torchrun, gloo on CPU): a sharded FSDP save (every
rank writes its shard on a worker thread, rank 0 commits on the main thread once all are written) and a DDP save
(rank 0's worker writes the whole state). Resume is bit-exact; a write that fails on one rank stops every rank,
naming it, and the previous checkpoint stays intact (issue 39, part 5). See ``_background_script.py``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from ..._dist_helpers import free_port
from .conftest import run_to_end

pytestmark = [pytest.mark.distributed, pytest.mark.torch, pytest.mark.timeout(240)]

SCRIPT = str(Path(__file__).with_name("_background_script.py"))
KEPT = "step_00000002-epoch_0-batch_2"


def _run(out: Path, driver: str) -> dict[int, dict]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
           str(free_port()), SCRIPT, str(out), driver]
    done = run_to_end(cmd, out, 200)
    print(f"\ntorchrun, 2 ranks, {driver}: {done.seconds:.1f} s")
    return {r: json.loads((out / f"{driver}-rank{r}.json").read_text()) for r in range(2)}


@pytest.mark.parametrize(("driver", "failing_rank"), [("torch_fsdp", 1), ("torch", 0)])
def test_background_saves_with_two_ranks(driver, failing_rank, tmp_path) -> None:
    results = _run(tmp_path, driver)
    for rank, result in results.items():
        assert result["resumed"] == result["straight"], f"rank {rank}: the resume is not bit-exact"
        assert result["listing_after_stop"] == [KEPT, "step_00000004-epoch_0-batch_4"]
        assert result["error"] is not None and "injected" in result["error"], result["error"]
        if driver == "torch_fsdp":
            assert f"rank {failing_rank} failed" in result["error"]
        elif rank != failing_rank:
            assert "on rank 0" in result["error"]
        assert 4 < result["failed_at"] <= 6  # at a step boundary once the write had failed, at most the next save
        assert result["failing_listing"] == [KEPT] and result["intact"] is True
    assert results[0]["failed_at"] == results[1]["failed_at"]  # every rank stopped at the same step
