"""The resume rule across world sizes with real processes (gloo on CPU), for DDP, FSDP and DeepSpeed ZeRO-2.

A checkpoint records the epoch, the samples of it all ranks consumed, and the steps taken; a run resumed
at another world size re-derives its batch position in its own layout, ``n_epochs`` counts epochs, and a
resumed run with nothing left trains nothing (see docs/user-guide/checkpoints.md, "The resume rule").
tests/core/test_resume_world_size.py checks the arithmetic with simulated ranks; here real process groups
check its boundaries:

1. epoch boundary: 2 ranks train 2 epochs (a checkpoint each epoch), 3 ranks (and one process) resume with
   ``n_epochs=3``: exactly the third epoch is trained, every sample once (the padding of an uneven last
   global batch aside), and the run ends at the 2-rank steps plus this layout's steps of one epoch;
2. mid-epoch: 2 ranks stop after 4 batches of epoch 2, 3 ranks (and one process) train the rest of it once;
3. end of run: the final checkpoint resumed at 3 ranks (and one process) with the same ``n_epochs`` trains
   nothing, fires nothing, rewrites no checkpoint, and says "nothing to train" in one line.

Two torchrun launches of ``_world_size_script.py`` (see its docstring) run every phase: 2 ranks writing the
checkpoints, then 3 ranks resuming them; the one-process resumes run in the test's own process.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from ..._dist_helpers import free_port
from . import _world_size_script as script
from .conftest import run_to_end

pytestmark = [pytest.mark.distributed, pytest.mark.torch, pytest.mark.timeout(300)]
SUITE_SECONDS = 21  # seconds, measured alone (tests/conftest.py splits the process tests into shards by it)

TIMEOUT = 120  # one launch; its phases take seconds
SCRIPT = str(Path(__file__).with_name("_world_size_script.py"))
N, B = script.N_TRAIN, script.BATCH_PER_RANK
TRAINED_STEPS = script.N_EPOCHS * script.batches_per_epoch(2)  # what the 2-rank run took: 2 x 13
CONSUMED = script.MID_BATCHES * B * 2  # samples of epoch 2 the 2-rank `mid` run consumed
HAS_DEEPSPEED = all(importlib.util.find_spec(name) is not None for name in ("deepspeed", "drivetrain_deepspeed"))
NEEDS_DEEPSPEED = pytest.mark.skipif(not HAS_DEEPSPEED, reason="driver='deepspeed' needs deepspeed and drivetrain-deepspeed "
                                     "(pip install -e backends/deepspeed deepspeed)")
DRIVER_CLASSES = {"ddp": "TorchDDPDriver", "fsdp": "TorchFSDPDriver", "ds": "TorchDeepSpeedDriver"}
WITH_DEEPSPEED = ("ds",) if HAS_DEEPSPEED else ()


def _launch(out: Path, nproc: int, phases: list[str], *extra: str) -> Path:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port",
           str(free_port()), SCRIPT, str(out), ",".join(phases), *extra]
    done = run_to_end(cmd, out, TIMEOUT)
    print(f"\ntorchrun, {nproc} ranks, {len(phases)} phases: {done.seconds:.1f} s")
    return out


def _read(out: Path, phase: str, world: int) -> list[dict]:
    return [json.loads((out / f"{phase}-rank{r}.json").read_text()) for r in range(world)]


def _padding(samples: int, world: int) -> int:
    """Samples the sampler repeats to split the last global batch of ``samples`` evenly over ``world`` ranks."""
    rest = samples % (B * world)
    return 0 if world == 1 or not rest else -(-rest // world) * world - rest


@pytest.fixture(scope="module")
def two(tmp_path_factory) -> Path:
    """2 ranks: 2 epochs with a checkpoint each epoch (every driver), and DDP ended inside epoch 2."""
    phases = ["ddp-train", "ddp-mid", "fsdp-train", *(f"{d}-train" for d in WITH_DEEPSPEED)]
    return _launch(tmp_path_factory.mktemp("two"), 2, phases)


@pytest.fixture(scope="module")
def three(two, tmp_path_factory) -> Path:
    """3 ranks resuming the 2-rank checkpoints: the end of the run first (it must leave them as they are)."""
    phases = [f"{d}-{what}" for d in ("ddp", "fsdp", *WITH_DEEPSPEED) for what in ("end", "epoch")]
    return _launch(tmp_path_factory.mktemp("three"), 3, [*phases, "ddp-rest"], "--source", str(two))


@pytest.fixture(scope="module")
def one(two, tmp_path_factory) -> Path:
    """One process (``driver="torch"``, this test's process) resuming the 2-rank DDP checkpoints."""
    out = tmp_path_factory.mktemp("one")
    for phase in ("ddp-end", "ddp-epoch", "ddp-rest"):
        script.run_phase(phase, str(out), str(two))
    return out


def _resumed(request, world: int) -> Path:
    return request.getfixturevalue({3: "three", 1: "one"}[world])


def _check_ranks(results: list[dict], driver: str, world: int) -> None:
    for rank, result in enumerate(results):
        assert result["rank"] == rank and result["world_size"] == world
        if world > 1:
            assert result["driver"] == DRIVER_CLASSES[driver]
        assert result["seen"] == result["idx"]  # the indices the event passes are the batch's samples


# ------------------------------------------------------------------------- the 2-rank runs
@pytest.mark.parametrize("driver", ["ddp", "fsdp", pytest.param("ds", marks=NEEDS_DEEPSPEED)])
def test_two_ranks_train_two_epochs_and_checkpoint_each(two, driver) -> None:
    results = _read(two, f"{driver}-train", 2)
    _check_ranks(results, driver, 2)
    for result in results:
        assert result["step"] == TRAINED_STEPS == 26 and result["epoch"] == 2
    for epoch in ("0", "1"):
        assert sorted(results[0]["seen"][epoch] + results[1]["seen"][epoch]) == list(range(N))  # 100 = 12 x 8 + 4
    assert sorted(results[0]["manifests_after"]) == ["last", "step_00000013-epoch_1-batch_0",
                                                     "step_00000026-epoch_2-batch_0"]


def test_two_ranks_end_inside_the_second_epoch(two) -> None:
    results = _read(two, "ddp-mid", 2)
    _check_ranks(results, "ddp", 2)
    for result in results:
        assert result["step"] == script.MID_STEP == 17 and result["epoch"] == 1
        assert len(result["seen"]["1"]) == script.MID_BATCHES * B
    assert sorted(results[0]["manifests_after"]) == ["last"]


# ------------------------------------------------------------- 1. the epoch boundary
@pytest.mark.parametrize(("driver", "world"), [
    ("ddp", 3), ("ddp", 1), ("fsdp", 3), pytest.param("ds", 3, marks=NEEDS_DEEPSPEED)])
def test_an_epoch_end_checkpoint_resumed_at_another_world_size_trains_exactly_one_more_epoch(
        request, driver, world) -> None:
    """2 epochs at 2 ranks, ``n_epochs=3`` at 3 ranks: the third epoch in 9 steps of 12 samples (the last 4
    samples split 2 per rank, so 2 repeated); at one process in 25 steps of 4."""
    results = _read(_resumed(request, world), f"{driver}-epoch", world)
    _check_ranks(results, driver, world)
    expected_step = TRAINED_STEPS + script.batches_per_epoch(world)
    for result in results:
        assert sorted(result["seen"]) == ["2"]  # the third epoch, and only it
        assert result["counts"] == {"on_train_begin": 1, "on_train_epoch_begin": 1, "on_train_epoch_end": 1,
                                    "on_train_end": 1}
        assert result["epoch"] == 3
        assert result["step"] == result["n_batches"] == expected_step  # 26 + ceil(100 / (4 x world))
    trained = [i for result in results for i in result["seen"]["2"]]
    # every sample once; the padding of the last global batch repeats the first samples of the epoch's order,
    # which rank 0 took in the first global batch
    padded = results[0]["seen"]["2"][:_padding(N, world)]
    assert len(padded) == {3: 2, 1: 0}[world]
    assert sorted(trained) == sorted([*range(N), *padded])


# ------------------------------------------------------------------- 2. inside an epoch
@pytest.mark.parametrize("world", [3, 1])
def test_a_mid_epoch_checkpoint_resumed_at_another_world_size_trains_the_rest_of_the_epoch_once(
        request, two, world) -> None:
    """2 ranks consumed 32 samples of epoch 2 (4 steps of 8); 3 ranks train the other 68 in 6 steps of 12
    (the last 8 split 3 per rank, 1 repeated), one process in 17 steps of 4."""
    before = _read(two, "ddp-mid", 2)
    first_part = before[0]["seen"]["1"] + before[1]["seen"]["1"]
    assert len(set(first_part)) == CONSUMED
    results = _read(_resumed(request, world), "ddp-rest", world)
    _check_ranks(results, "ddp", world)
    expected_step = script.MID_STEP + script.batches_per_epoch(world, N - CONSUMED)
    for result in results:
        assert sorted(result["seen"]) == ["1"]  # the rest of epoch 2, no later epoch
        assert result["counts"]["on_train_epoch_end"] == 1 and result["epoch"] == 2
        assert result["step"] == result["n_batches"] == expected_step  # 17 + ceil(68 / (4 x world))
    trained = [i for result in results for i in result["seen"]["1"]]
    # no sample of the first part again but the padding, which repeats the start of the epoch's order: the
    # first samples rank 0 took in epoch 2 at 2 ranks
    padded = before[0]["seen"]["1"][:_padding(N - CONSUMED, world)]
    assert len(padded) == {3: 1, 1: 0}[world]
    assert [i for i in trained if i in set(first_part)] == padded
    assert sorted(trained) == sorted([*(set(range(N)) - set(first_part)), *padded])


# -------------------------------------------------------------------- 3. the end of the run
@pytest.mark.parametrize(("driver", "world"), [
    ("ddp", 3), ("ddp", 1), ("fsdp", 3), pytest.param("ds", 3, marks=NEEDS_DEEPSPEED)])
def test_the_final_checkpoint_resumed_at_another_world_size_with_the_same_n_epochs_trains_nothing(
        request, two, driver, world) -> None:
    out = _resumed(request, world)
    results = _read(out, f"{driver}-end", world)
    _check_ranks(results, driver, world)
    written = _read(two, f"{driver}-train", 2)[0]["manifests_after"]  # the checkpoints as the 2 ranks left them
    assert "last" in written
    for result in results:
        assert result["seen"] == {}  # no batch on any rank
        assert set(result["counts"].values()) == {0}  # no event fired
        assert result["step"] == TRAINED_STEPS and result["epoch"] == 2
        assert result["manifests_before"] == result["manifests_after"] == written  # `last` not rewritten
    log = (out / f"{driver}-end-log-rank0.txt").read_text()
    assert log.count("nothing to train") == 1, log
    assert "the end of epoch 2 (step 26) and n_epochs=2 asks for no more" in log and "n_epochs=3" in log, log
    assert _read(two, f"{driver}-train", 2)[0]["manifests_after"] == script.manifests(str(two / f"{driver}-ckpt"))
