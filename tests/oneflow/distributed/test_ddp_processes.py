"""Distributed oneflow training with real processes (2 CPU ranks), through the public API.

Both ways to start (``python -m oneflow.distributed.launch`` and the Trainer's own
supervisor, ``nproc=2`` in a plain ``python script.py``) end with the parameters of
one process training with the global batch; evaluation splits an odd-sized set; the
object collectives built on oneflow's tensor collectives work; the checkpoint is written
once. Then failures: a rank that raises, is killed or stalls takes every process down
within the bound, with a non-zero exit. The processes run ``_ddp_script.py``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import pytest

from drivetrain import Trainer, predict
from drivetrain._common.errors import DriverError
from drivetrain.backend._plugins import create_driver

from ..._dist_helpers import listeners, session_pids, wait_for_file
from ..conftest import flow
from . import _ddp_script as script
from .conftest import alive, oneflow_launch, self_launch

pytestmark = [pytest.mark.distributed, pytest.mark.oneflow]

TIMEOUT = 150  # for a whole launch; the processes themselves finish in seconds
FAIL_TIMEOUT = 8.0  # oneflow_kwargs['timeout'] in the failure runs


def _read(out: Path) -> dict[int, dict]:
    return {r: json.loads((out / f"train-rank{r}.json").read_text()) for r in (0, 1)}


def _flat(params: dict) -> np.ndarray:
    return np.concatenate([np.asarray(v, np.float64) for _, v in sorted(params.items())])


@pytest.fixture(scope="module")
def reference() -> dict:
    """One process with the global batch (2 x 4): the parameters and evaluation DDP must reproduce."""
    model = script.Net()
    trainer = script.build_trainer(model, batch_size=2 * script.BATCH_PER_RANK)
    trainer.run(num_eval_sanity_batch=0)
    return {"params": script.params(model), "eval": trainer.evaluate()}


@pytest.fixture(scope="module")
def launched(tmp_path_factory) -> dict[str, dict[int, dict]]:
    """The training run started both ways (once per module: each launch costs seconds)."""
    from .conftest import ProcessGroup

    runs = {}
    for name, command in (("oneflow", oneflow_launch), ("self", self_launch)):
        out = tmp_path_factory.mktemp(f"train-{name}")
        group = ProcessGroup(command("train", str(out)), out)
        try:
            done = group.wait(TIMEOUT)
        finally:
            group.close()
        assert done.returncode == 0, done.output[-4000:]
        runs[name] = {"ranks": _read(out), "out": out, "output": done.output}
    return runs


@pytest.mark.parametrize("how", ["oneflow", "self"])
def test_two_processes_match_one_process_with_the_global_batch(launched, reference, how) -> None:
    ranks = launched[how]["ranks"]
    assert [ranks[r]["world_size"] for r in (0, 1)] == [2, 2] and ranks[0]["distributed"]
    assert ranks[0]["params"] == ranks[1]["params"]  # DDP kept the replicas identical
    ours, theirs = _flat(ranks[0]["params"]), _flat(reference["params"])
    assert np.linalg.norm(ours - theirs) / np.linalg.norm(theirs) < 1e-5
    assert not np.array_equal(ours, _flat(script.params(script.Net())))  # it trained


def test_both_launches_give_the_same_result(launched) -> None:
    assert launched["oneflow"]["ranks"][0]["params"] == launched["self"]["ranks"][0]["params"]


def test_each_rank_trains_on_its_own_half_of_every_epoch(launched) -> None:
    ranks = launched["oneflow"]["ranks"]
    per_epoch = script.N_TRAIN // 2
    for epoch in range(script.N_EPOCHS):
        mine = [ranks[r]["seen"][epoch * per_epoch:(epoch + 1) * per_epoch] for r in (0, 1)]
        assert sorted(mine[0] + mine[1]) == list(range(script.N_TRAIN))


def test_evaluation_splits_an_odd_set_and_equals_one_process(launched, reference) -> None:
    for r in (0, 1):
        assert launched["oneflow"]["ranks"][r]["eval"] == pytest.approx(reference["eval"])


def test_prediction_gathers_every_rank_in_dataset_order(launched) -> None:
    ranks = launched["oneflow"]["ranks"]
    model = script.Net()
    model.load_state_dict({k: flow.tensor(np.asarray(v, dtype=np.float32).reshape(model.state_dict()[k].shape))
                           for k, v in ranks[0]["params"].items()})
    alone = predict(model, flow.utils.data.DataLoader(script.Points(script.N_EVAL, 1), batch_size=3),
                    driver="oneflow", progress_bar=None)
    for r in (0, 1):
        assert ranks[r]["predicted_idx"] == list(range(script.N_EVAL))  # the dataset's order, each sample once
        np.testing.assert_allclose(ranks[r]["predicted"], alone["pred"], rtol=1e-5, atol=1e-6)


def test_object_collectives_built_on_tensor_collectives(launched) -> None:
    for r in (0, 1):
        report = launched["oneflow"]["ranks"][r]
        assert report["gathered"] == [{"rank": 0, "text": ""}, {"rank": 1, "text": "x" * 100}]
        assert report["broadcast"] == ["from", 1]
        assert report["max"] == [1, 0] and report["sum"] == [2.0]


def test_the_checkpoint_is_written_once_and_loads_in_one_process(launched) -> None:
    folder = launched["oneflow"]["out"] / "checkpoint"
    assert sorted(os.listdir(folder)) == ["manifest.json", "model.safetensors", "training_state.json",
                                          "training_state.safetensors"]
    assert not [name for name in os.listdir(folder.parent) if name.startswith(".tmp")]
    model = script.Net()
    trainer = script.build_trainer(model, batch_size=script.BATCH_PER_RANK, evaluate=False)
    trainer.load_checkpoint(folder)
    assert script.params(model) == launched["oneflow"]["ranks"][0]["params"]


@pytest.mark.slow
def test_resume_inside_an_accumulation_cycle_is_exact(launch, tmp_path, launched) -> None:
    """The checkpoint holds gradients of a half-done cycle; they go back into DDP's all-reduce buckets."""
    for what in ("interrupt", "resume"):
        done = launch(oneflow_launch(what, str(tmp_path))).wait(TIMEOUT)
        assert done.returncode == 0, done.output[-4000:]
    state = json.loads((tmp_path / "interrupted" / "training_state.json").read_text())
    assert [sorted(p["gradients"]) for p in state["processes"]] == [["fc1.bias", "fc1.weight", "fc2.bias",
                                                                      "fc2.weight"]] * 2  # a cycle was pending
    for r in (0, 1):
        resumed = json.loads((tmp_path / f"resume-rank{r}.json").read_text())
        assert resumed["params"] == launched["oneflow"]["ranks"][0]["params"]


@pytest.mark.slow
@pytest.mark.parametrize("how", ["oneflow", "self"])
@pytest.mark.parametrize("mode", ["raise", "kill", "stall"])
def test_a_failing_rank_takes_every_process_down_in_bounded_time(launch, tmp_path, how, mode) -> None:
    command = oneflow_launch if how == "oneflow" else self_launch
    group = launch(command("fail", str(tmp_path), mode, "--timeout", str(FAIL_TIMEOUT)))
    if how == "self" and mode == "stall":  # both workers alive until the timeout: what does the run listen on?
        _only_oneflows_control_servers_listen_beyond_loopback(group.proc.pid, tmp_path)
    done = group.wait(TIMEOUT)
    assert done.returncode != 0, done.output[-3000:]
    assert done.seconds < 60, f"took {done.seconds:.0f} s:\n{done.output[-3000:]}"
    pids = [int((tmp_path / name).read_text()) for name in os.listdir(tmp_path) if name.startswith("pid-rank")]
    assert len(pids) >= 2
    # oneflow's launcher sometimes exits without killing the other worker; that one, blocked in a collective,
    # is ended by drivetrain's watchdog: the bound is the run's timeout and the watchdog's grace
    deadline = time.monotonic() + FAIL_TIMEOUT + 7
    while [pid for pid in pids if alive(pid)] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [pid for pid in pids if alive(pid)], "a process outlived the failed run"
    if mode == "raise":
        assert "drivetrain: rank 1 of 2 failed: CallbackError" in done.output
    if mode == "stall":
        assert "did not answer within oneflow_kwargs['timeout']=8 s" in done.output and "oneflow's collectives have no timeout" in done.output
    if how == "self":
        assert "drivetrain: the distributed run failed: rank" in done.output
        if mode == "kill":
            assert "rank 1 of 2 was killed by SIGKILL" in done.output


def _only_oneflows_control_servers_listen_beyond_loopback(leader: int, out: Path) -> None:
    """The supervisor (drivetrain's) listens on nothing; each worker on oneflow's control server only, which
    oneflow 0.9 binds to every interface with no setting to change it (see docs/distributed.md)."""
    wait_for_file(out / "at-rank1", timeout=60)
    workers = sorted(int((out / f"pid-rank{r}").read_text()) for r in (0, 1))
    heard = listeners(session_pids(leader))
    assert not [s for s in heard if s.pid not in workers], [str(s) for s in heard]
    assert sorted(s.pid for s in heard if not s.loopback) == workers, [str(s) for s in heard]


def test_under_pytest_the_trainer_cannot_start_processes_and_says_so() -> None:
    with pytest.raises(DriverError, match="runs under pytest.*python -m oneflow.distributed.launch"):
        create_driver("oneflow", script.Net(), "cpu", nproc=2)


@pytest.mark.parametrize(("options", "fragment"), [
    ({"nproc": 0}, "nproc=0 is not accepted"),
    ({"device": []}, r"device=\[\] is empty"),
    ({"device": ["cpu", "cpu"]}, "pass device='cpu', nproc=2"),
    ({"device": "cpu", "nproc": 2, "framework_kwargs": {"timeout": -1}}, r"oneflow_kwargs\['timeout'\]=-1"),
    ({"device": "cpu", "nproc": 2, "framework_kwargs": {"ddp_kwargs": {"find_unused_parameters": True}}},
     "broadcast_parameters is always on"),
    ({"device": "cpu", "nproc": 2, "framework_kwargs": {"spawn_output": "files"}}, "spawn_output"),
])
def test_bad_distributed_arguments_fail_before_any_process_starts(options, fragment) -> None:
    device = options.pop("device", "cpu")
    with pytest.raises(DriverError, match=fragment):
        create_driver("oneflow", script.Net(), device, **options)


def test_single_process_refuses_distributed_only_options() -> None:
    net = script.Net()
    with pytest.raises(DriverError, match=r"oneflow_kwargs\['timeout'\] applies to distributed oneflow training"):
        Trainer(net, [{"x": flow.ones(1, 4)}], flow.optim.SGD(net.parameters(), lr=0.1), driver="oneflow",
                progress_bar=None, oneflow_kwargs={"timeout": 5})
