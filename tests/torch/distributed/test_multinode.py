"""Two "nodes" on one machine: two ``torchrun --nnodes 2 --nproc_per_node 1`` launchers on 127.0.0.1.

Both ways torchrun joins machines are tested, and both engines, each once (the rendezvous
is torchrun's and the engine's process group is the same either way, so the full matrix
would test nothing more): the c10d rendezvous (``--rdzv_backend c10d --rdzv_endpoint``,
what elastic jobs and most clusters use) with FSDP2 (``driver="torch_fsdp"``), and the
static one (``--node_rank`` with ``--master_addr/--master_port``, what a SLURM script
writes) with DDP (``driver="torch"``). Each node runs
``_multinode_script.py``; both must end with identical parameters, equal to one process
trained on the global batch. Every launcher runs in its own session and is killed at the
end, whatever happened; a launch is bounded by ``TIMEOUT``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from ... import _dist_helpers
from ..._dist_helpers import free_port
from . import _fsdp_script as script
from .conftest import child_env

pytestmark = [pytest.mark.distributed, pytest.mark.torch, pytest.mark.timeout(180)]
SUITE_SECONDS = 16  # seconds, measured alone (tests/conftest.py splits the process tests into shards by it)

TIMEOUT = 120  # both nodes together; training itself takes seconds
SCRIPT = str(Path(__file__).with_name("_multinode_script.py"))


@pytest.fixture(scope="module")
def reference() -> dict[str, list[float]]:
    """One process on the global batch (2 nodes x 4): the parameters both nodes must end with."""
    torch.manual_seed(0)
    model = script.Net()
    script.build_trainer(model, batch_size=2 * script.BATCH_PER_RANK, driver="torch", callbacks=[]).run(
        num_eval_sanity_batch=0)
    return script.state_lists(model.state_dict())


def _node_command(rendezvous: str, node: int, port: int, out: Path, driver: str) -> list[str]:
    run = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1",
           "--max_restarts", "0", "--monitor_interval", "0.2"]
    if rendezvous == "c10d":
        run += ["--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}", "--rdzv_id", "multinode-test",
                "--rdzv_conf", "join_timeout=60"]
    else:
        run += ["--node_rank", str(node), "--master_addr", "127.0.0.1", "--master_port", str(port)]
    return [*run, SCRIPT, str(out), driver]


@pytest.mark.parametrize(("rendezvous", "driver"), [("c10d", "torch_fsdp"), ("static", "torch")])
def test_two_nodes_match_one_process(rendezvous: str, driver: str, reference, tmp_path) -> None:
    port = free_port()
    nodes = [_dist_helpers.ProcessGroup(_node_command(rendezvous, n, port, tmp_path, driver), tmp_path, child_env(),
                                        name=f"node{n}") for n in (0, 1)]
    try:
        done = [node.wait(TIMEOUT) for node in nodes]
    finally:
        for node in nodes:
            node.close()
    logs = "\n".join(f"--- node {n}:\n{d.output[-4000:]}" for n, d in enumerate(done))
    assert [d.returncode for d in done] == [0, 0], logs
    print(f"\n{rendezvous} {driver}: {max(d.seconds for d in done):.1f} s")
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    expected_driver = "TorchFSDPDriver" if driver == "torch_fsdp" else None
    for rank, result in enumerate(results):
        assert result["rank"] == rank and result["world_size"] == 2 and result["local_rank"] == 0
        if expected_driver:
            assert result["driver"] == expected_driver
    assert sorted(r["group_rank"] for r in results) == [0, 1]  # one rank on each node
    assert results[0]["params"] == results[1]["params"]
    diff = max(abs(a - b) for name in reference
               for a, b in zip(results[0]["params"][name], reference[name], strict=True))
    assert diff < 1e-5, diff
