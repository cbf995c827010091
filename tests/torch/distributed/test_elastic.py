"""Elastic restart: a rank killed with SIGKILL under ``torchrun --max-restarts 1`` and ``resume_from="latest"``.

torchrun restarts the whole group; every rank resumes from the newest checkpoint the
CheckpointCallback wrote, and the finished run equals an unbroken one (trained afterwards by the same
processes, see ``_elastic_script.py``). The launcher runs in its own session, is killed whole at the
end whatever happened, and is bounded by ``TIMEOUT``.

No ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``: with torch's default (the c10d rendezvous store shared with the
workers) restarted workers that start their group with plain ``init_process_group`` read the previous
attempt's gloo addresses from that store and cannot connect (pytorch/pytorch#135712, torch 2.13); the
torch drivers give each attempt its own keys, so the default works.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from ... import _dist_helpers
from ..._dist_helpers import free_port
from .conftest import child_env

pytestmark = [pytest.mark.distributed, pytest.mark.torch, pytest.mark.timeout(180)]
SUITE_SECONDS = 34  # seconds, measured alone (tests/conftest.py splits the process tests into shards by it)

TIMEOUT = 150
SCRIPT = str(Path(__file__).with_name("_elastic_script.py"))
KILL_AT = 5  # 12 batches in all (6 per epoch); checkpoints every 2, so the restart resumes from batch 4


@pytest.mark.parametrize("driver", ["torch", "torch_fsdp", "deepspeed"])
def test_killed_rank_restarts_and_resumes_from_latest(tmp_path, driver) -> None:
    """DDP (one-file checkpoints), FSDP2 and DeepSpeed ZeRO-2 (each rank writes its shards; the restarted ranks read
    theirs)."""
    if driver == "deepspeed":
        pytest.importorskip("deepspeed", reason="driver='deepspeed' needs pip install -e backends/deepspeed deepspeed")
        pytest.importorskip("drivetrain_deepspeed", reason="driver='deepspeed' needs pip install -e backends/deepspeed")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--max-restarts", "1",
           "--monitor_interval", "0.2", "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{free_port()}",
           "--rdzv_id", "elastic-test", SCRIPT, str(tmp_path), str(KILL_AT), driver]
    env = dict(child_env())
    group = _dist_helpers.ProcessGroup(cmd, tmp_path, env)
    try:
        done = group.wait(TIMEOUT)
    finally:
        group.close()
    assert done.returncode == 0, done.output[-6000:]
    print(f"\nelastic restart: {done.seconds:.1f} s")
    assert (tmp_path / "killed").read_text() == str(KILL_AT)
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["restart_count"] == 1, result["restart_count"]
    assert result["started"] == 4  # the newest checkpoint before the kill
    diff = max(abs(a - b) for name in result["unbroken"]
               for a, b in zip(result["elastic"][name], result["unbroken"][name], strict=True))
    assert diff <= 1e-6, diff
    if driver != "torch":
        assert sorted(p.name for p in (tmp_path / "ckpt").glob("*/shards-*"))  # the sharded format was used
