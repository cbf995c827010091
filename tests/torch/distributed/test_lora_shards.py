"""Drivers that shard the model (``torch_fsdp``; ``deepspeed`` at ZeRO-3) on 2 ranks with a peft LoRA adapter on a
frozen GPT-2 base (built from its config): each rank's shard file holds its share of the adapter only, the resume
is bit-exact, another base is refused, and one process reads the 2-rank checkpoint. See
``_lora_shards_script.py`` for the phases."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from ..._dist_helpers import free_port
from .conftest import run_to_end

pytest.importorskip("peft")
pytest.importorskip("transformers")

pytestmark = [pytest.mark.distributed, pytest.mark.torch, pytest.mark.timeout(300)]
SUITE_SECONDS = 41  # seconds, measured alone (tests/conftest.py splits the process tests into shards by it)

SCRIPT = str(Path(__file__).with_name("_lora_shards_script.py"))


def _launch(driver: str, out: Path, phases: str, nproc: int, *extra: str) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port",
           str(free_port()), SCRIPT, driver, str(out), phases, *extra]
    run_to_end(cmd, out, 240)


def _read(out: Path, phase: str, world: int = 2) -> dict[int, dict]:
    return {r: json.loads((out / f"{phase}-rank{r}.json").read_text()) for r in range(world)}


@pytest.fixture(scope="module", params=["torch_fsdp", "deepspeed"])
def run(request, tmp_path_factory) -> Path:
    if request.param == "deepspeed":
        pytest.importorskip("deepspeed")
        pytest.importorskip("drivetrain_deepspeed", reason="driver='deepspeed' needs pip install -e backends/deepspeed")
    out = tmp_path_factory.mktemp(f"{request.param}-lora")
    _launch(request.param, out, "reference,interrupt,resume,other-base", 2)
    _launch(request.param, out, "load", 1, str(out / "ckpt"))
    return out


def test_each_rank_writes_only_its_share_of_the_adapter(run) -> None:
    folder = run / "ckpt"
    manifest = json.loads((folder / "manifest.json").read_text())
    stored = json.loads((folder / "shards.json").read_text())["tensors"]
    models = {key[len("model/"):] for key in stored if key.startswith("model/")}
    assert models and all("lora_" in name for name in models), sorted(models)[:5]
    frozen = manifest["frozen"]["tensors"]
    assert any(name.endswith("c_attn.base_layer.weight") for name in frozen) and not set(frozen) & models
    state = _read(run, "interrupt")[0]["state"]
    trainable = sum(len(v) for name, v in state.items() if "lora_" in name)
    shard_bytes = sum(os.path.getsize(folder / name) for name in manifest["sharded"]["files"])
    # the adapter's fp32 values and AdamW's two moments, plus the files' headers; the base is not there
    assert 3 * 4 * trainable <= shard_bytes < 3 * 4 * trainable + 16384, (shard_bytes, trainable)
    assert manifest["frozen"]["bytes"] > 5 * shard_bytes  # the base, left out


def test_resume_at_two_ranks_is_bit_exact(run) -> None:
    reference, resumed = _read(run, "reference"), _read(run, "resume")
    for rank in (0, 1):
        assert resumed[rank]["steps"] == reference[rank]["steps"]
        assert resumed[rank]["state"] == reference[rank]["state"]


def test_another_base_is_refused_and_says_why(run) -> None:
    for record in _read(run, "other-base").values():
        assert record["error"] and "not the ones it was trained on" in record["error"], record


def test_one_process_reads_the_two_rank_checkpoint(run) -> None:
    assert _read(run, "load", 1)[0]["state"] == _read(run, "interrupt")[0]["state"]
