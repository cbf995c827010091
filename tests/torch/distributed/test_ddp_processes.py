"""Distributed torch training with real processes (gloo on CPU, 2 ranks), through the public API.

The three ways to start: torchrun, the Trainer's own spawn (``nproc=2`` in a plain
``python script.py``), and a process group plus DDP model the user made. Each ends with
the same parameters as one process training with the global batch size. Then resume
across world sizes, evaluation on an odd-sized set, and failures: a rank that raises,
stalls or is killed takes every other process down within the bound.

The script the processes run is ``_ddp_script.py`` (see its docstring).
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

from ..._dist_helpers import assert_loopback_only
from . import _ddp_script as script
from .conftest import alive, spawn, torchrun, wait_for_file

pytestmark = [pytest.mark.distributed, pytest.mark.torch]
SUITE_SECONDS = 88  # seconds, measured alone (tests/conftest.py splits the process tests into shards by it)

TIMEOUT = 120  # for a whole launch; the processes themselves finish in seconds


def _read(out: Path, phase: str) -> dict[int, dict]:
    return {r: json.loads((out / f"{phase}-rank{r}.json").read_text()) for r in (0, 1)}


def _flat(params: dict) -> torch.Tensor:
    return torch.tensor(list(itertools.chain(*params.values())), dtype=torch.float64)


def _max_diff(a: dict, b: dict) -> float:
    return float((_flat(a) - _flat(b)).abs().max())


# ------------------------------------------------------------ one-process references
@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    """One process, global batch (2 x 4), same seed: the parameters DDP must reproduce; and a
    one-process run interrupted after 5 batches, to be resumed by two processes."""
    out = tmp_path_factory.mktemp("reference")
    torch.manual_seed(0)
    model = script.Net()
    trainer = script.build_trainer(model, batch_size=2 * script.BATCH_PER_RANK, callbacks=[], evaluate=True,
                                   log_every_n_steps=3)
    trainer.run(num_eval_sanity_batch=0)
    history = trainer.history
    evaluated = trainer.evaluate()
    torch.manual_seed(0)
    recorder = script.Recorder()
    folder = out / "one-process-interrupted"
    script.build_trainer(script.Net(), batch_size=script.BATCH_PER_RANK,
                         callbacks=[recorder, script.StopAt(5, str(folder))]).run()
    return {"params": script.params_of(model), "eval": evaluated, "folder": folder, "seen": recorder.seen,
            "history": history}


@pytest.fixture(scope="module")
def torchrun_run(reference, tmp_path_factory) -> Path:
    """One torchrun launch running the phases full, interrupt, resume-same and resume (from one process)."""
    from .conftest import ProcessGroup

    out = tmp_path_factory.mktemp("torchrun")
    group = ProcessGroup(torchrun("train", str(out), "full,interrupt,resume-same,resume",
                                  "--resume-from", str(reference["folder"])), out)
    try:
        done = group.wait(TIMEOUT)
    finally:
        group.close()
    assert done.returncode == 0, done.output
    print(f"\ntorchrun, 4 phases: {done.seconds:.1f} s")
    return out


# ------------------------------------------------------------------------ launching
def test_torchrun_matches_one_process_with_the_global_batch(torchrun_run, reference) -> None:
    full = _read(torchrun_run, "full")
    for rank, result in full.items():
        assert result["driver"] == "TorchDDPDriver" and result["rank"] == rank and result["world_size"] == 2
        assert _max_diff(result["params"], reference["params"]) < 1e-6
    # the two ranks trained on disjoint halves of every global batch, together the whole set, each epoch
    for epoch in ("0", "1"):
        seen = full[0]["seen"][epoch] + full[1]["seen"][epoch]
        assert sorted(seen) == list(range(script.N_TRAIN))


def test_evaluation_splits_an_odd_set_and_equals_one_process(torchrun_run, reference) -> None:
    full = _read(torchrun_run, "full")
    for result in full.values():
        assert result["eval"] == pytest.approx(reference["eval"], abs=1e-12)
        assert result["eval"]["acc#acc"] == pytest.approx(result["eval_by_hand"], abs=1e-6)


def test_callbacks_run_on_every_rank_rank_zero_only_on_rank_zero(torchrun_run) -> None:
    full = _read(torchrun_run, "full")
    for result in full.values():
        assert result["counts"] == {"on_train_epoch_end": 2, "on_evaluate_end": 3}
    assert full[0]["zero_only"] == 1 and full[1]["zero_only"] == 0


def test_prediction_gathers_every_rank_in_dataset_order(torchrun_run) -> None:
    full = _read(torchrun_run, "full")
    for rank in (0, 1):
        predicted = full[rank]["predict"]
        assert predicted["idx"] == list(range(script.N_EVAL))  # the dataset's order, each sample once
        assert torch.allclose(torch.tensor(predicted["pred"]), torch.tensor(full[0]["pred_by_hand"]), atol=1e-6)
        assert full[rank]["streamed_equal"]


def test_the_run_record_is_written_once_with_losses_averaged_over_the_ranks(torchrun_run, reference) -> None:
    full = _read(torchrun_run, "full")
    with open(torchrun_run / "record" / "metrics.jsonl") as f:
        rows = [json.loads(line) for line in f]
    train = [row for row in rows if "train/loss" in row]
    assert [row["step"] for row in train] == [3, 6, 9, 12]  # rank 0 alone wrote: each step once
    expected = [row["train/loss"] for row in reference["history"]["train"]]
    assert [row["train/loss"] for row in train] == pytest.approx(expected, rel=1e-5)
    assert full[0]["history"]["train"] == full[1]["history"]["train"]  # every rank holds the reduced numbers
    # samples/s counts both ranks: 8 samples per step (2 x 4) over the same seconds as steps/s
    assert all(row["train/samples_per_s"] == pytest.approx(8 * row["train/steps_per_s"]) for row in train)
    assert [row["step"] for row in rows if "eval/acc#acc" in row] == [6, 12]


def test_checkpoints_are_written_once_without_leftovers(torchrun_run) -> None:
    folder = torchrun_run / "ckpt-full"
    assert sorted(os.listdir(folder)) == ["step_00000006-epoch_1-batch_0", "step_00000012-epoch_2-batch_0"]
    manifest = json.loads((folder / "step_00000006-epoch_1-batch_0" / "manifest.json").read_text())
    assert manifest["trainer"]["world_size"] == 2
    assert not [p for p in torchrun_run.rglob(".tmp-*")]


def test_resume_with_the_same_world_size_is_exact(torchrun_run) -> None:
    full, resumed = _read(torchrun_run, "full"), _read(torchrun_run, "resume-same")
    for rank in (0, 1):
        assert _max_diff(resumed[rank]["params"], full[rank]["params"]) == 0.0


def test_resume_one_process_checkpoint_on_two(torchrun_run, reference) -> None:
    """1 -> 2: every sample of the interrupted epoch is seen exactly once overall."""
    before = reference["seen"]["0"]
    assert len(before) == 5 * script.BATCH_PER_RANK
    after = _read(torchrun_run, "resume")
    seen = before + after[0]["seen"]["0"] + after[1]["seen"]["0"]
    assert sorted(seen) == list(range(script.N_TRAIN))


def test_resume_two_process_checkpoint_on_one(torchrun_run) -> None:
    """2 -> 1, in this process: every sample of the interrupted epoch is seen exactly once overall."""
    interrupted = _read(torchrun_run, "interrupt")
    before = interrupted[0]["seen"]["0"] + interrupted[1]["seen"]["0"]
    assert len(before) == script.INTERRUPT_AT * 2 * script.BATCH_PER_RANK
    torch.manual_seed(0)
    recorder = script.Recorder()
    trainer = script.build_trainer(script.Net(), batch_size=script.BATCH_PER_RANK, callbacks=[recorder])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.run(resume_from=str(torchrun_run / "interrupted"))
    assert any("drops the gradients" in str(w.message) for w in caught)  # it stopped inside an accumulation cycle
    assert sorted(before + recorder.seen["0"]) == list(range(script.N_TRAIN))
    assert sorted(recorder.seen["1"]) == list(range(script.N_TRAIN))


def test_trainer_starts_the_other_process_itself(launch, tmp_path, reference) -> None:
    """``python script.py`` with nproc=2: re-run as rank 1, output prefixed, same result as one process."""
    done = launch(spawn("train", str(tmp_path), "full", "--nproc", "2", "--prefix")).wait(TIMEOUT)
    assert done.returncode == 0, done.output
    assert "[rank 1] rank-done 1" in done.output and "rank-done 0" in done.output
    full = _read(tmp_path, "full")
    assert full[1]["pid"] != full[0]["pid"]
    for result in full.values():
        assert _max_diff(result["params"], reference["params"]) < 1e-6
        assert result["eval"] == pytest.approx(reference["eval"], abs=1e-12)


def test_python_c_cannot_start_processes_and_says_so(launch, tmp_path) -> None:
    code = ("import torch; from drivetrain import Trainer; m = torch.nn.Linear(2, 2); "
            "Trainer(m, [{}], torch.optim.SGD(m.parameters(), lr=0.1), driver='torch', nproc=2)")
    done = launch([sys.executable, "-c", code]).wait(TIMEOUT)
    assert done.returncode == 1
    assert "program was given as a string (python -c)" in done.output and "torchrun --nproc_per_node N" in done.output


def test_a_users_process_group_and_ddp_model_are_used_as_they_are(launch, tmp_path, reference) -> None:
    done = launch(torchrun("train", str(tmp_path), "full", "--user-init")).wait(TIMEOUT)
    assert done.returncode == 0, done.output
    for result in _read(tmp_path, "full").values():
        assert result["driver"] == "TorchDDPDriver"
        assert _max_diff(result["params"], reference["params"]) < 1e-6


# ------------------------------------------------------------------------- failures
def _pids(out: Path) -> list[int]:
    return [int((out / f"pid-rank{r}").read_text()) for r in (0, 1)]


def _all_gone(pids: list[int], within: float) -> float:
    start = time.monotonic()
    while any(alive(p) for p in pids):
        if time.monotonic() - start > within:
            pytest.fail(f"processes {[p for p in pids if alive(p)]} still run {within} s later")
        time.sleep(0.05)
    return time.monotonic() - start


def test_a_rank_that_raises_takes_the_others_down_naming_it(launch, tmp_path) -> None:
    done = launch(spawn("fail", str(tmp_path), "raise", "--timeout", "90")).wait(TIMEOUT)
    assert done.returncode != 0
    assert "ValueError: boom on purpose" in done.output
    assert "DistributedError" in done.output and "because rank 1 raised" in done.output
    assert "did not answer within" not in done.output  # the peer's error, not the collective's timeout
    assert _all_gone(_pids(tmp_path), within=1.0) < 1.0
    assert done.seconds < 90  # before the timeout could have fired (seconds on an idle machine; 34 s under load)


def test_a_started_process_that_dies_before_the_trainer_is_reported_at_once(launch, tmp_path) -> None:
    done = launch(spawn("fail", str(tmp_path), "early")).wait(TIMEOUT)  # the default 60 s timeout
    assert done.returncode != 0
    assert "did not all reach Trainer(...): rank 1 exited with code 3" in done.output
    assert done.seconds < 30


def test_a_stalled_rank_fails_the_others_after_the_timeout(launch, tmp_path) -> None:
    done = launch(spawn("fail", str(tmp_path), "stall", "--timeout", "3")).wait(TIMEOUT)
    assert done.returncode != 0
    assert "did not answer within torch_kwargs['timeout']=3 s" in done.output
    _all_gone(_pids(tmp_path), within=1.0)


def test_the_launcher_stuck_outside_collectives_is_stopped_when_a_rank_fails(launch, tmp_path) -> None:
    """Rank 0 hangs in its own code: rank 1 times out and exits, then rank 0 is stopped a timeout later."""
    done = launch(spawn("fail", str(tmp_path), "stall", "--victim", "0", "--timeout", "2")).wait(TIMEOUT)
    assert done.returncode != 0
    assert "rank 1 exited with code 1, and rank 0 (this process) is still running 2 s later" in done.output
    _all_gone(_pids(tmp_path), within=1.0)


@pytest.mark.parametrize("victim", [1, 0], ids=["kill-rank1", "kill-rank0-the-launcher"])
def test_a_killed_rank_takes_every_process_down(launch, tmp_path, victim) -> None:
    """Also, while both ranks train: a run on one host listens on loopback only (store, gloo)."""
    group = launch(spawn("fail", str(tmp_path), "mark", "--timeout", "20"))
    wait_for_file(tmp_path / f"at-rank{victim}", timeout=60)
    assert assert_loopback_only(group.proc.pid)  # and the listing sees them (the store at least)
    pids = _pids(tmp_path)
    os.kill(pids[victim], signal.SIGKILL)
    took = _all_gone(pids, within=20)
    done = group.wait(TIMEOUT)
    assert done.returncode != 0
    if victim == 1:
        assert "because rank 1 was killed by SIGKILL" in done.output
        assert took < 5
    print(f"\nall processes gone {took:.2f} s after rank {victim} was killed")


# ------------------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")
def test_nccl_on_two_gpus_matches_one_process(launch, tmp_path, reference) -> None:
    done = launch(spawn("train", str(tmp_path), "full", "--device", "0,1")).wait(TIMEOUT)
    assert done.returncode == 0, done.output
    for result in _read(tmp_path, "full").values():
        assert _max_diff(result["params"], reference["params"]) < 1e-4  # GPU kernels round differently
