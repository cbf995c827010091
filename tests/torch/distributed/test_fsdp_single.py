"""``driver="torch_fsdp"`` in a world of one: one plain process, ``torchrun --nproc_per_node 1``, and sharded
checkpoints moving between 2 ranks and 1 (CPU, gloo, through the public API).

One process starts a process group of itself alone (an in-process store, no port) and shards
over it: every "shard" is the whole tensor, and the run equals ``driver="torch"``. The
in-process tests build their Trainers in the test process and destroy the group afterwards
(the driver keeps it for later Trainers of the process, as every launch's group is kept).
Every run takes batches of 4 per rank (a checkpoint keeps the batch size); one rank
accumulates 4 of them where two ranks accumulate 2, so every optimizer step sees the same 16
samples at either world size, and a checkpoint of either resumed at the other ends where
the uninterrupted run does. The launches run ``_fsdp_script.py`` (see its docstring).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from drivetrain import Callback, CallbackError, Trainer

from ..._dist_helpers import free_port
from . import _fsdp_script as script
from .conftest import child_env, max_diff, run_to_end

pytestmark = [pytest.mark.distributed, pytest.mark.torch, pytest.mark.timeout(240)]

TIMEOUT = 150  # one launch; the phases themselves take seconds
SCRIPT = str(Path(__file__).with_name("_fsdp_script.py"))
ONE_RANK = {"batch_size": script.BATCH_PER_RANK, "accumulation_steps": 2 * script.ACCUMULATION}
FP32 = 1e-6  # the same arithmetic, summed in another order


def _read(out: Path, phase: str, world: int) -> dict[int, dict]:
    return {r: json.loads((out / f"{phase}-rank{r}.json").read_text()) for r in range(world)}


def _torchrun(out: Path, nproc: int, phases: str, *extra: str) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port",
           str(free_port()), SCRIPT, str(out), phases, *extra]
    done = run_to_end(cmd, out, TIMEOUT)
    print(f"\ntorchrun, {nproc} rank(s), {phases}: {done.seconds:.1f} s")


def _alone() -> None:
    """Destroy the group of one a Trainer of this process started (a later Trainer would use it)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


@pytest.fixture
def alone():
    """The test starts without a process group and leaves none behind."""
    assert not dist.is_initialized(), "an earlier test left a process group in this process"
    yield
    _alone()


@pytest.fixture(scope="module")
def one(tmp_path_factory) -> dict:
    """In this process: ``driver="torch"`` (the reference), FSDP in a world of one trained the same way, and FSDP
    in a world of one interrupted where 2 ranks are after ``INTERRUPT_AT`` batches (into ./interrupted)."""
    assert not dist.is_initialized(), "an earlier test left a process group in this process"
    out = tmp_path_factory.mktemp("one")
    results = {}
    try:
        for name, driver in (("reference", "torch"), ("fsdp", "torch_fsdp")):
            torch.manual_seed(0)
            model = script.Net()
            trainer = script.build_trainer(model, driver=driver, callbacks=[], evaluate=True, **ONE_RANK)
            d = trainer.driver
            trainer.run(num_eval_sanity_batch=0)
            results[name] = {"driver": type(d).__name__, "world_size": d.world_size, "describe": d.describe(),
                             "launch": getattr(getattr(d, "plan", None), "launch", None),
                             "params": script.state_lists(d.model_state()), "history": trainer.history,
                             "eval": trainer.evaluate(), "initialised": dist.is_initialized()}
            _alone()
        torch.manual_seed(0)
        recorder = script.Recorder()
        stop = script.StopAt(2 * script.INTERRUPT_AT, str(out / "interrupted"))  # the samples of 2 ranks' 4 batches
        script.build_trainer(script.Net(), driver="torch_fsdp", callbacks=[recorder, stop], **ONE_RANK).run()
        results["seen"] = recorder.seen
    finally:
        _alone()
    return {**results, "folder": out / "interrupted"}


@pytest.fixture(scope="module")
def two(one, tmp_path_factory) -> Path:
    """2 ranks: interrupted after ``INTERRUPT_AT`` batches of 4 (./interrupted, 2 shard files), and the
    one-process checkpoint resumed."""
    out = tmp_path_factory.mktemp("two")
    _torchrun(out, 2, "interrupt,resume-source", "--source", str(one["folder"]))
    return out


@pytest.fixture(scope="module")
def torchrun_one(two, tmp_path_factory) -> Path:
    """``torchrun --nproc_per_node 1``: the whole run, then the 2-rank checkpoint resumed."""
    out = tmp_path_factory.mktemp("torchrun-one")
    _torchrun(out, 1, "full,resume-source", "--accumulation", str(ONE_RANK["accumulation_steps"]), "--source",
              str(two / "interrupted"))
    return out


# ------------------------------------------------------------------------ one process
def test_one_process_shards_over_a_world_of_one_and_equals_driver_torch(one) -> None:
    fsdp, reference = one["fsdp"], one["reference"]
    assert fsdp["driver"] == "TorchFSDPDriver" and fsdp["world_size"] == 1 and fsdp["launch"] == "single"
    assert "rank 0/1 backend=gloo" in fsdp["describe"]
    assert reference["driver"] == "TorchSingleDriver" and not reference["initialised"]
    assert fsdp["initialised"]  # its own group, kept for later Trainers of the process
    assert max_diff(fsdp["params"], reference["params"]) < FP32  # accumulation 2, AdamW, clipping
    assert fsdp["eval"] == pytest.approx(reference["eval"], abs=1e-12)
    expected = [row["train/grad_norm"] for row in reference["history"]["train"] if "train/grad_norm" in row]
    got = [row["train/grad_norm"] for row in fsdp["history"]["train"] if "train/grad_norm" in row]
    assert expected and got == pytest.approx(expected, rel=1e-5)


def test_the_checkpoint_of_one_process_is_a_sharded_one_of_one_file(one) -> None:
    manifest = json.loads((one["folder"] / "manifest.json").read_text())
    assert manifest["sharded"]["world_size"] == 1
    assert manifest["sharded"]["files"] == ["shards-00000-of-00001.safetensors"]


def test_nproc_1_and_a_list_of_one_device_are_a_world_of_one(alone) -> None:
    for layout in ({"nproc": 1}, {"device": ["cpu"]}):
        trainer = _build(**layout)
        assert trainer.driver.world_size == 1 and trainer.driver.plan.launch == "single", layout
        _alone()


def test_a_later_trainer_of_the_process_uses_the_group_of_one(alone) -> None:
    first = _build()
    second = _build()
    assert first.driver.plan.launch == "single" and second.driver.plan.launch == "existing"
    assert second.driver.world_size == 1
    second.run()


def test_a_failure_in_a_world_of_one_raises_and_leaves_the_group_usable(alone) -> None:
    """Every rank (the one) failed: collectives stay allowed, so the failure is the user's error, not a hang."""

    class Boom(Callback):
        def on_train_batch_end(self, trainer) -> None:
            raise ValueError("boom")

    trainer = _build(callbacks=[Boom()])
    with pytest.raises(CallbackError, match="boom"):
        trainer.run()
    trainer.driver.barrier()  # not refused, does not wait for anyone


def test_cpu_offload_on_the_cpu_is_still_refused_in_one_process(alone) -> None:
    from drivetrain import DriverError

    with pytest.raises(DriverError, match=r"cpu_offload.*GPU"):
        _build(torch_fsdp_kwargs={"cpu_offload": True})
    assert not dist.is_initialized()  # refused before any group started


def test_a_hugging_face_gpt2_from_its_config_equals_driver_torch(alone) -> None:
    """Tied input/output embeddings and GPT2Block blocks (the default rule) in a world of one."""
    transformers = pytest.importorskip("transformers")
    settings = {"vocab_size": 50, "n_positions": 16, "n_embd": 16, "n_layer": 2, "n_head": 2, "use_cache": False,
                "bos_token_id": 0, "eos_token_id": 0}
    ids = torch.randint(0, 50, (8, 16), generator=torch.Generator().manual_seed(3))
    params = {}
    for driver in ("torch", "torch_fsdp"):
        torch.manual_seed(0)
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**settings))
        loader = DataLoader(ids, batch_size=2, collate_fn=lambda rows: {"input_ids": torch.stack(rows),
                                                                        "labels": torch.stack(rows)})
        trainer = Trainer(model, loader, torch.optim.AdamW(model.parameters(), lr=0.01), driver=driver, n_epochs=1,
                          progress_bar=None)
        trainer.run()
        params[driver] = script.state_lists(trainer.driver.model_state())
    assert "lm_head.weight" in params["torch_fsdp"] and "transformer.wte.weight" in params["torch_fsdp"]
    assert params["torch_fsdp"]["lm_head.weight"] == params["torch_fsdp"]["transformer.wte.weight"]  # still tied
    assert max_diff(params["torch_fsdp"], params["torch"]) < 1e-5


# ----------------------------------------------------------------------- torchrun
def test_torchrun_with_one_process_per_node_equals_one_process(torchrun_one, one) -> None:
    result = _read(torchrun_one, "full", 1)[0]
    assert result["driver"] == "TorchFSDPDriver" and result["world_size"] == 1 and result["rank"] == 0
    assert max_diff(result["params"], one["reference"]["params"]) < FP32
    assert sorted(p.name for p in (torchrun_one / "model").glob("shards-*")) == ["shards-00000-of-00001.safetensors"]


# -------------------------------------------------------------------- checkpoints
def test_a_two_rank_checkpoint_resumes_in_one_process_to_the_uninterrupted_end(torchrun_one, two, one) -> None:
    assert json.loads((two / "interrupted" / "manifest.json").read_text())["sharded"]["world_size"] == 2
    resumed = _read(torchrun_one, "resume-source", 1)[0]
    assert resumed["world_size"] == 1
    assert max_diff(resumed["params"], one["reference"]["params"]) < FP32
    before = _read(two, "interrupt", 2)
    seen = [i for r in (0, 1) for i in before[r]["seen"]["0"]] + resumed["seen"]["0"]
    assert sorted(seen) == list(range(script.N_TRAIN))  # every sample of the first epoch once


def test_a_one_process_checkpoint_resumes_on_two_ranks_to_the_uninterrupted_end(two, one) -> None:
    resumed = _read(two, "resume-source", 2)
    for rank in (0, 1):
        assert resumed[rank]["world_size"] == 2
        assert max_diff(resumed[rank]["params"], one["reference"]["params"]) < FP32
    seen = one["seen"]["0"] + resumed[0]["seen"]["0"] + resumed[1]["seen"]["0"]
    assert sorted(seen) == list(range(script.N_TRAIN))


# ------------------------------------------------------------------------ GPU
@pytest.mark.gpu
def test_cpu_offload_on_one_gpu_equals_driver_torch(alone) -> None:
    """device='cuda' in one process: nccl over a world of one, the shards and AdamW's state in CPU memory."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    params = {}
    for driver, options in (("torch", {}), ("torch_fsdp", {"torch_fsdp_kwargs": {"cpu_offload": True}})):
        torch.manual_seed(0)
        model = script.Net()
        trainer = script.build_trainer(model, driver=driver, callbacks=[], device="cuda", **ONE_RANK, **options)
        trainer.run()
        d = trainer.driver
        if driver == "torch_fsdp":
            assert d.world_size == 1 and d.plan.backend == "nccl" and d.plan.launch == "single"
            assert {p.device.type for p in d.model.parameters()} == {"cpu"}  # offloaded shards
        params[driver] = script.state_lists(d.model_state())
    assert max_diff(params["torch_fsdp"], params["torch"]) < 1e-5  # another summation order on the GPU


def _build(**options) -> Trainer:
    model = script.Net()
    loader = DataLoader(script.Points(8, seed=0), batch_size=4)
    return Trainer(model, loader, torch.optim.SGD(model.parameters(), lr=0.1), driver="torch_fsdp",
                   progress_bar=None, **options)


def test_drivetrain_backends_check_torch_fsdp_passes() -> None:
    """The contract checks on driver='torch_fsdp' in one process (its own process, so the group of one it starts
    stays there), the two that checkpoint inside an accumulation cycle waived by its kit with the reason. They
    found that a world of one refused a list of batches, and that an Evaluator could not take a model a Trainer had
    sharded."""
    done = subprocess.run([sys.executable, "-m", "drivetrain", "backends", "--check", "torch_fsdp"],
                          capture_output=True, text=True, timeout=200, env=child_env())
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "20/20 checks passed, 2 waived by the kit" in done.stdout and "FAILED" not in done.stdout
    assert "WAIVED gradient_state_round_trip" in done.stdout
