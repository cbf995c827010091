"""``every_n_seconds`` and ``load_best_model_at_end`` with two real DDP processes (torchrun, gloo on CPU): the ranks
save together on rank 0's clock whatever their own clocks say, and both end with the best checkpoint's weights.
See ``_time_and_best_script.py``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from ..._dist_helpers import free_port
from .conftest import run_to_end

pytestmark = [pytest.mark.distributed, pytest.mark.torch, pytest.mark.timeout(180)]

SCRIPT = str(Path(__file__).with_name("_time_and_best_script.py"))


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[Path, dict[int, dict]]:
    out = tmp_path_factory.mktemp("time-and-best")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           SCRIPT, str(out)]
    run_to_end(cmd, out, 150)
    return out, {r: json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)}


def test_the_ranks_save_together_on_rank_zero_clock(run) -> None:
    out, ranks = run
    assert ranks[0]["saved_at"] == ranks[1]["saved_at"]
    periodic = [name for name in ranks[0]["periodic"] if name.startswith("step_")]  # rank 0 writes them
    assert len(periodic) >= 1  # 18 batches of at least 0.06 s (over 1 s), a save due every 0.2 s
    assert {int(name.split("-")[0][len("step_"):]) for name in periodic} <= set(ranks[0]["saved_at"])
    assert len(periodic) < 12  # not at nearly every batch, as rank 1's clock alone would ask
    assert all((out / "periodic" / name / "manifest.json").is_file() for name in periodic)


def test_both_ranks_end_with_the_best_checkpoint_weights(run) -> None:
    out, ranks = run
    best = ranks[0]["best"]
    assert best == ranks[1]["best"] and best.startswith(str(out / "best"))
    evaluations = ranks[0]["evaluations"]
    top = max(e["acc#acc#dev"] for e in evaluations)
    first_top = next(e["step"] for e in evaluations if e["acc#acc#dev"] == top)
    assert best.endswith(f"step_{first_top:08d}"), (best, evaluations)
    saved = load_file(str(Path(best) / "model.safetensors"))
    for rank in (0, 1):
        for name, values in ranks[rank]["model"].items():
            assert saved[name].flatten().tolist() == values, (rank, name)
        if first_top != 18:  # the best was not the last step: the trained weights were replaced
            assert ranks[rank]["trained"] != ranks[rank]["model"]
