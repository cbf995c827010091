"""Distributed paddle training with real processes (gloo on CPU, 2 ranks), through the public API.

The three ways to start: paddle's launcher, the Trainer's own spawn (``nproc=2`` in a
plain ``python script.py``, here in fleet collective mode), and two processes given
paddle's variables by a scheduler, whose script initialises paddle itself and wraps the
model in ``paddle.DataParallel``. Each ends with the same parameters as one process
training with the global batch size. Then resume across world sizes, evaluation on an
odd-sized set, and failures: a rank that raises, stalls or is killed takes every other
process down within the bound, naming it.

The script the processes run is ``_dist_script.py`` (see its docstring).
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from ..._dist_helpers import assert_loopback_only, process_env
from . import _dist_script as script
from .conftest import ProcessGroup, alive, free_ports, paddle_launch, preset_env, spawn, wait_for_file

pytestmark = [pytest.mark.distributed, pytest.mark.paddle]

TIMEOUT = 120  # for a whole launch; the processes themselves finish in seconds


def _read(out: Path, phase: str) -> dict[int, dict]:
    return {r: json.loads((out / f"{phase}-rank{r}.json").read_text()) for r in (0, 1)}


def _flat(params: dict) -> np.ndarray:
    return np.array(list(itertools.chain(*params.values())), dtype=np.float64)


def _max_diff(a: dict, b: dict) -> float:
    return float(np.abs(_flat(a) - _flat(b)).max())


# ------------------------------------------------------------ one-process references
@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    """One process, global batch (2 x 4), same seeds: the parameters two processes must reproduce;
    and a one-process run interrupted after 5 batches, to be resumed by two processes."""
    out = tmp_path_factory.mktemp("reference")
    model = script.make_net()
    trainer = script.build_trainer(model, batch_size=2 * script.BATCH_PER_RANK, callbacks=[], evaluate=True)
    trainer.run(num_eval_sanity_batch=0)
    evaluated = trainer.evaluate()
    recorder = script.Recorder()
    folder = out / "one-process-interrupted"
    script.build_trainer(script.make_net(), batch_size=script.BATCH_PER_RANK,
                         callbacks=[recorder, script.StopAt(5, str(folder))]).run()
    big = script.make_net()  # one batch of 16 = 2 processes x 4 samples x 2 accumulated batches
    script.build_trainer(big, batch_size=2 * script.BATCH_PER_RANK * script.ACCUMULATION, callbacks=[],
                         accumulation=1).run()
    return {"params": script.params_of(model), "eval": evaluated, "folder": folder, "seen": recorder.seen,
            "big_batch": script.params_of(big)}


@pytest.fixture(scope="module")
def launcher_run(reference, tmp_path_factory) -> Path:
    """One paddle launcher start running the phases full, interrupt, resume-same, resume (from one process)
    and unused."""
    out = tmp_path_factory.mktemp("launcher")
    group = ProcessGroup(paddle_launch(out / "paddle-logs", "train", str(out), "full,interrupt,resume-same,resume,unused",
                                       "--resume-from", str(reference["folder"])), out)
    try:
        done = group.wait(TIMEOUT)
    finally:
        group.close()
    logs = "".join(p.read_text(errors="replace") for p in sorted((out / "paddle-logs").glob("workerlog.*")))
    assert done.returncode == 0, done.output + logs
    print(f"\npaddle launcher, 5 phases: {done.seconds:.1f} s")
    return out


# ------------------------------------------------------------------------ launching
def test_launcher_matches_one_process_with_the_global_batch(launcher_run, reference) -> None:
    full = _read(launcher_run, "full")
    for rank, result in full.items():
        assert result["driver"] == "PaddleDataParallelDriver" and result["rank"] == rank
        assert result["world_size"] == 2 and "backend=gloo" in result["describe"]
        assert _max_diff(result["params"], reference["params"]) < 1e-5
    # the two ranks trained on disjoint halves of every global batch, together the whole set, each epoch
    for epoch in ("0", "1"):
        seen = full[0]["seen"][epoch] + full[1]["seen"][epoch]
        assert sorted(seen) == list(range(script.N_TRAIN))


def test_accumulation_over_two_processes_equals_one_big_batch(launcher_run, reference) -> None:
    """Gradients are averaged once per step: 2 processes x batch 4 x 2 accumulated batches == one batch of 16."""
    for result in _read(launcher_run, "full").values():
        assert _max_diff(result["params"], reference["big_batch"]) < 1e-5


def test_parameters_some_ranks_do_not_use_need_find_unused_parameters(launcher_run) -> None:
    _check_unused(launcher_run)


def _check_unused(run: Path) -> None:
    results = {r: json.loads((run / f"unused-rank{r}.json").read_text()) for r in (0, 1)}
    for result in results.values():
        assert "DriverError: the processes computed gradients for different parameters" in result["False"]["error"]
        assert "'find_unused_parameters': True" in result["False"]["error"]
    with_flag = [results[r]["True"] for r in (0, 1)]
    assert _max_diff(with_flag[0]["after"], with_flag[1]["after"]) == 0.0  # the ranks agree
    moved = {name: _max_diff({name: with_flag[0]["after"][name]}, {name: with_flag[0]["before"][name]})
             for name in with_flag[0]["after"]}
    assert all(change > 0 for change in moved.values())  # rank 1's gradient reached rank 0's copy too


@pytest.fixture(scope="module")
def overlap_run(tmp_path_factory) -> Path:
    """paddle's launcher again, with paddle_kwargs={'overlap': True}: the phases full and unused."""
    out = tmp_path_factory.mktemp("overlap")
    group = ProcessGroup(paddle_launch(out / "paddle-logs", "train", str(out), "full,unused", "--overlap", "on"), out)
    try:
        done = group.wait(TIMEOUT)
    finally:
        group.close()
    logs = "".join(p.read_text(errors="replace") for p in sorted((out / "paddle-logs").glob("workerlog.*")))
    assert done.returncode == 0, done.output + logs
    return out


def test_overlap_averages_in_backward_as_one_process_with_the_global_batch(overlap_run, launcher_run,
                                                                            reference) -> None:
    """DataParallel's reducer averages during backward, suspended (no_sync) on the first batch of each
    accumulation cycle: the same parameters as one process (global batch, and one batch of 16)."""
    for result in _read(overlap_run, "full").values():
        assert "gradients averaged during backward" in result["describe"]
        assert result["synced"] == [False, True] * (len(result["synced"]) // 2)
        assert _max_diff(result["params"], reference["params"]) < 1e-5
        assert _max_diff(result["params"], reference["big_batch"]) < 1e-5
        assert result["eval"] == pytest.approx(reference["eval"], abs=1e-12)
    for result in _read(launcher_run, "full").values():  # gloo's default: averaged in step(), never by the reducer
        assert "during backward" not in result["describe"] and not any(result["synced"])


def test_overlap_still_refuses_unused_parameters_without_find_unused_parameters(overlap_run) -> None:
    """The reducer would pair different parameters' buckets silently; the first step refuses instead."""
    _check_unused(overlap_run)


def test_the_launchers_log_folder_stays_out_of_the_working_directory(launcher_run) -> None:
    assert (launcher_run / "paddle-logs" / "workerlog.1").exists()
    assert not (launcher_run / "log").exists()
    assert not any(result["log_dir_in_cwd"] for result in _read(launcher_run, "full").values())


def test_evaluation_splits_an_odd_set_and_equals_one_process(launcher_run, reference) -> None:
    full = _read(launcher_run, "full")
    for result in full.values():
        assert result["eval"] == pytest.approx(reference["eval"], abs=1e-12)
        assert result["eval"]["acc#acc"] == pytest.approx(result["eval_by_hand"], abs=1e-6)


def test_prediction_gathers_every_rank_in_dataset_order(launcher_run) -> None:
    full = _read(launcher_run, "full")
    for result in full.values():
        assert result["predict"]["idx"] == list(range(script.N_EVAL))  # the dataset's order, each sample once
        np.testing.assert_allclose(result["predict"]["pred"], full[0]["pred_by_hand"], atol=1e-6)
        assert result["streamed_equal"]


def test_callbacks_run_on_every_rank_rank_zero_only_on_rank_zero(launcher_run) -> None:
    full = _read(launcher_run, "full")
    for result in full.values():
        assert result["counts"] == {"on_train_epoch_end": 2, "on_evaluate_end": 3}
    assert full[0]["zero_only"] == 1 and full[1]["zero_only"] == 0


def test_checkpoints_are_written_once_by_rank_zero(launcher_run) -> None:
    folder = launcher_run / "ckpt-full"
    assert sorted(os.listdir(folder)) == ["step_00000006-epoch_1-batch_0", "step_00000012-epoch_2-batch_0"]
    manifest = json.loads((folder / "step_00000006-epoch_1-batch_0" / "manifest.json").read_text())
    assert manifest["trainer"]["world_size"] == 2
    assert not list(launcher_run.rglob(".tmp-*"))


def test_resume_with_the_same_world_size_is_exact(launcher_run) -> None:
    full, resumed = _read(launcher_run, "full"), _read(launcher_run, "resume-same")
    for rank in (0, 1):
        assert _max_diff(resumed[rank]["params"], full[rank]["params"]) == 0.0


def test_resume_one_process_checkpoint_on_two(launcher_run, reference) -> None:
    """1 -> 2: every sample of the interrupted epoch is seen exactly once overall."""
    before = reference["seen"]["0"]
    assert len(before) == 5 * script.BATCH_PER_RANK
    after = _read(launcher_run, "resume")
    seen = before + after[0]["seen"]["0"] + after[1]["seen"]["0"]
    assert sorted(seen) == list(range(script.N_TRAIN))


def test_resume_two_process_checkpoint_on_one(launcher_run) -> None:
    """2 -> 1, in this process: every sample of the interrupted epoch is seen exactly once overall."""
    interrupted = _read(launcher_run, "interrupt")
    before = interrupted[0]["seen"]["0"] + interrupted[1]["seen"]["0"]
    assert len(before) == script.INTERRUPT_AT * 2 * script.BATCH_PER_RANK
    recorder = script.Recorder()
    trainer = script.build_trainer(script.make_net(), batch_size=script.BATCH_PER_RANK, callbacks=[recorder])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.run(resume_from=str(launcher_run / "interrupted"))
    assert any("drops the gradients" in str(w.message) for w in caught)  # it stopped inside an accumulation cycle
    assert sorted(before + recorder.seen["0"]) == list(range(script.N_TRAIN))
    assert sorted(recorder.seen["1"]) == list(range(script.N_TRAIN))


def test_trainer_starts_the_other_process_itself_in_fleet_mode(launch, tmp_path, reference) -> None:
    """``python script.py`` with nproc=2 and fleet: re-run as rank 1, output prefixed, same result as one process."""
    done = launch(spawn("train", str(tmp_path), "full", "--nproc", "2", "--prefix", "--fleet")).wait(TIMEOUT)
    assert done.returncode == 0, done.output
    assert "[rank 1] rank-done 1" in done.output and "rank-done 0" in done.output
    full = _read(tmp_path, "full")
    assert full[1]["pid"] != full[0]["pid"]
    for result in full.values():
        assert "fleet collective" in result["describe"]
        assert _max_diff(result["params"], reference["params"]) < 1e-5
        assert result["eval"] == pytest.approx(reference["eval"], abs=1e-12)
    assert not (tmp_path / "log").exists()
    assert not list(Path(tempfile.gettempdir()).glob(f"drivetrain-run-{full[0]['pid']}-*"))  # its store, removed


def test_an_environment_set_by_a_scheduler_and_a_users_data_parallel_model(launch, tmp_path, reference) -> None:
    """No launcher: the variables are set from outside, the script calls init_parallel_env and wraps the model."""
    ports = free_ports(2)
    groups = [launch(spawn("train", str(tmp_path), "full", "--user-init"), env=preset_env(rank, ports),
                     name=f"rank{rank}") for rank in (0, 1)]
    for group in groups:
        done = group.wait(TIMEOUT)
        assert done.returncode == 0, done.output
    for result in _read(tmp_path, "full").values():
        assert result["driver"] == "PaddleDataParallelDriver"
        assert _max_diff(result["params"], reference["params"]) < 1e-5


def test_python_c_cannot_start_processes_and_says_so(launch, tmp_path) -> None:
    code = ("import paddle; from drivetrain import Trainer; m = paddle.nn.Linear(2, 2); "
            "Trainer(m, [{}], paddle.optimizer.SGD(parameters=m.parameters()), driver='paddle', nproc=2)")
    done = launch([sys.executable, "-c", code]).wait(TIMEOUT)
    assert done.returncode == 1
    assert "program was given as a string (python -c)" in done.output
    assert "python -m paddle.distributed.launch --nproc_per_node N" in done.output


# ------------------------------------------------------------------------- failures
OVERLAP = pytest.mark.parametrize("overlap", [[], ["--overlap", "on"]], ids=["default", "overlap"])
"""gloo's default (gradients averaged in step()), and paddle_kwargs={'overlap': True} (in backward, by
DataParallel's reducer, which aborts the process on a gloo error)."""

def _pids(out: Path) -> list[int]:
    return [int((out / f"pid-rank{r}").read_text()) for r in (0, 1)]


def _all_gone(pids: list[int], within: float) -> float:
    start = time.monotonic()
    while any(alive(p) for p in pids):
        if time.monotonic() - start > within:
            pytest.fail(f"processes {[p for p in pids if alive(p)]} still run {within} s later")
        time.sleep(0.05)
    return time.monotonic() - start


@OVERLAP
def test_a_rank_that_raises_takes_the_others_down_naming_it(launch, tmp_path, overlap) -> None:
    done = launch(spawn("fail", str(tmp_path), "raise", "--timeout", "20", *overlap)).wait(TIMEOUT)
    assert done.returncode != 0
    assert "ValueError: boom on purpose" in done.output
    assert "DistributedError" in done.output
    assert "because rank 1 raised CallbackError: callback Misbehave raised ValueError" in done.output
    assert _all_gone(_pids(tmp_path), within=1.0) < 1.0
    assert done.seconds < 20 + 10  # well inside the bound: the peer's error arrives at once


@OVERLAP
def test_a_rank_that_raises_under_the_launcher_is_named(launch, tmp_path, overlap) -> None:
    done = launch(paddle_launch(tmp_path / "paddle-logs", "fail", str(tmp_path), "raise", "--timeout", "20",
                                *overlap)).wait(TIMEOUT)
    assert done.returncode != 0
    logs = "".join(p.read_text(errors="replace") for p in sorted((tmp_path / "paddle-logs").glob("workerlog.*")))
    assert "ValueError: boom on purpose" in logs
    # whoever is first names rank 1: rank 0's DistributedError, or the launcher stopping rank 0 because of it
    assert ("because rank 1 raised CallbackError: callback Misbehave raised ValueError" in done.output + logs
            or "Container rank 1 status failed" in done.output)
    _all_gone(_pids(tmp_path), within=5.0)


def test_a_started_process_that_dies_before_the_trainer_is_reported_at_once(launch, tmp_path) -> None:
    done = launch(spawn("fail", str(tmp_path), "early")).wait(TIMEOUT)
    assert done.returncode != 0
    assert "did not all reach Trainer(...): rank 1 exited with code 3" in done.output
    assert done.seconds < 30


@OVERLAP
def test_a_stalled_rank_fails_the_others_after_the_timeout(launch, tmp_path, overlap) -> None:
    done = launch(spawn("fail", str(tmp_path), "stall", "--timeout", "3", *overlap)).wait(TIMEOUT)
    assert done.returncode != 0
    assert "did not answer within paddle_kwargs['timeout']=3 s" in done.output
    _all_gone(_pids(tmp_path), within=5.0)
    assert done.seconds < 3 + 25


@OVERLAP
@pytest.mark.parametrize("victim", [1, 0], ids=["kill-rank1", "kill-rank0-the-launcher"])
def test_a_killed_rank_takes_every_process_down(launch, tmp_path, victim, overlap) -> None:
    """Also, while both ranks train: nothing listens beyond loopback but paddle's own process-group store."""
    group = launch(spawn("fail", str(tmp_path), "mark", "--timeout", "20", *overlap))
    wait_for_file(tmp_path / f"at-rank{victim}", timeout=60)
    pids = _pids(tmp_path)
    master = int(process_env(pids[1])["PADDLE_MASTER"].rsplit(":", 1)[1])
    heard = assert_loopback_only(group.proc.pid, {master: "paddle's TCPStore binds every interface, whatever its host"})
    assert master in {s.port for s in heard}  # the listing sees it
    os.kill(pids[victim], signal.SIGKILL)
    took = _all_gone(pids, within=20)
    done = group.wait(TIMEOUT)
    assert done.returncode != 0
    if victim == 1 and not overlap:
        assert "because rank 1 was killed by SIGKILL" in done.output
    if victim == 1 and overlap:  # rank 0 (the launcher) usually waits in the reducer: gloo aborts it at once,
        # before anything can name rank 1 (see docs/backends/paddle.md); it is named if rank 0 was elsewhere
        assert "because rank 1 was killed by SIGKILL" in done.output or "terminate called" in done.output
    if victim == 1:
        assert took < 5
    print(f"\nall processes gone {took:.2f} s after rank {victim} was killed")


def test_a_killed_rank_zero_without_a_launcher_does_not_leave_rank_one_waiting(launch, tmp_path) -> None:
    """Set by a scheduler, no parent to stop anyone: rank 1 finds out by itself that rank 0 (and the store
    it hosted) is gone, and says so."""
    ports = free_ports(2)
    groups = [launch(spawn("fail", str(tmp_path), "mark", "--victim", "0", "--timeout", "20"),
                     env=preset_env(rank, ports), name=f"rank{rank}") for rank in (0, 1)]
    wait_for_file(tmp_path / "at-rank0", timeout=60)
    pids = _pids(tmp_path)
    os.kill(pids[0], signal.SIGKILL)
    took = _all_gone(pids, within=20)
    done = groups[1].wait(TIMEOUT)
    assert done.returncode == 1
    assert "DistributedError" in done.output and "failed on rank 1 of 2: another process ended" in done.output
    assert took < 10
    print(f"\nrank 1 gone {took:.2f} s after rank 0 was killed")
