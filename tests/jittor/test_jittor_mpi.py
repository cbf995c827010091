"""The MPI driver with real processes: ``mpirun -np 2`` on the CPU, each run bounded in time.

What is checked against a single process in this test's own process: the averaged
gradients (2 processes x 4 samples train exactly like 1 process x 8 samples over the
same global batches -- no double averaging, no plain sum), the data sharding, the
evaluation metrics (each sample evaluated once), the object and array collectives,
rank-zero checkpoints resumed sample-exactly under MPI, and that a failing or killed
process makes mpirun stop the run with a non-zero exit code instead of hanging.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from drivetrain import Accuracy, Evaluator, Event, Trainer, predict, seed_everything

from .conftest import Points, TinyNet, jt

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_mpi_script.py")
MPIRUN = shutil.which("mpirun")
LIMIT = 180  # seconds for one mpirun (warm jittor cache: ~5 s)

pytestmark = [
    pytest.mark.jittor,
    pytest.mark.distributed,
    pytest.mark.skipif(MPIRUN is None, reason="mpirun not found (apt-get install openmpi-bin libopenmpi-dev)"),
]


def mpirun(*args: str, timeout: float = LIMIT) -> tuple[int, str, float]:
    """Run the script under ``mpirun -np 2``; return (exit code, output, seconds). Never outlives ``timeout``."""
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1")
    command = [MPIRUN, "-np", "2", "--oversubscribe", sys.executable, SCRIPT, *args]
    start = time.monotonic()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"mpirun did not finish within {timeout} s (a hang):\n{output[-3000:]}")
    return proc.returncode, output, time.monotonic() - start


def records(folder) -> list[dict]:
    return [json.loads((folder / f"rank{r}.json").read_text()) for r in range(2)]


def params(folder, rank: int) -> dict[str, np.ndarray]:
    with np.load(folder / f"params{rank}.npz") as data:
        return {k: data[k] for k in data.files}


def single_process(optimizer: str = "sgd") -> tuple[Trainer, list[list[int]]]:
    """What the MPI script trains, in one process with the whole global batch."""
    seed_everything(0)
    model = TinyNet()
    opt = jt.optim.SGD(model.parameters(), lr=0.1) if optimizer == "sgd" else jt.optim.Adam(model.parameters(), lr=0.01)
    trainer = Trainer(model, Points(64, batch_size=8, shuffle=True), opt, driver="jittor", device="cpu", n_epochs=2,
                      progress_bar=None)
    seen: list[list[int]] = []
    trainer.add_callback_fn(Event.on_train_batch_begin(),
                            lambda t, batch, indices: seen.append(batch["index"].numpy().tolist()))
    trainer.run(num_eval_sanity_batch=0)
    return trainer, seen


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("mpi-train")
    code, output, _ = mpirun("train", str(out))
    assert code == 0, output[-3000:]
    return out


@pytest.mark.timeout(LIMIT + 60)
def test_two_processes_average_gradients_exactly_once(trained):
    reference, _ = single_process()
    want = {k: v.numpy() for k, v in reference.driver.model_state().items()}
    for rank in range(2):
        got = params(trained, rank)
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6,
                                       err_msg=f"rank {rank} {name}: 2 x 4 samples differ from 1 x 8 samples")
    # a plain sum (no averaging) or a double average would move the weights by 2x or 0.5x: far outside 1e-5
    start = {k: v.numpy() for k, v in TinyNet().state_dict().items()}
    moved = sum(float(np.abs(want[k] - start[k]).sum()) for k in want)
    assert moved > 0.1


@pytest.mark.timeout(LIMIT + 60)
def test_each_process_reads_its_half_of_every_global_batch(trained):
    first, second = records(trained)
    assert first["world_size"] == second["world_size"] == 2
    assert "(JittorMPIDriver) rank 0/2" in first["describe"]
    _, seen = single_process()
    assert len(first["seen"]) == len(second["seen"]) == len(seen) == 16
    for step, (mine, theirs, whole) in enumerate(zip(first["seen"], second["seen"], seen, strict=True)):
        assert len(mine) == len(theirs) == 4
        assert mine + theirs == whole, f"step {step}: ranks read {mine} + {theirs}, one process {whole}"


@pytest.mark.timeout(LIMIT + 60)
def test_metrics_and_collectives_across_processes(trained):
    first, second = records(trained)
    seed_everything(0)
    model = TinyNet()
    model.load_state_dict({k: jt.array(v) for k, v in params(trained, 0).items()})
    alone = Evaluator(model, Points(30, seed=1, batch_size=8), {"acc": Accuracy()}, driver="jittor", verbose=0).run()
    assert first["results"]["acc#acc"] == second["results"]["acc#acc"] == pytest.approx(alone["acc#acc"])
    for rec in (first, second):
        assert rec["gathered"] == [{"rank": 0, "text": "xxx"}, {"rank": 1, "text": "xxxx"}]
        assert rec["broadcast"] == [1, "from"]
        assert rec["sum"] == [3, 20]
        assert rec["max"] == [1.5, 0.0]
        assert rec["min"] == [0.0, -1.0]


def test_prediction_gathers_every_rank_in_dataset_order(trained):
    first, second = records(trained)
    seed_everything(0)
    model = TinyNet()
    model.load_state_dict({k: jt.array(v) for k, v in params(trained, 0).items()})
    alone = predict(model, Points(30, seed=1, batch_size=8), driver="jittor", progress_bar=None)
    for rec in (first, second):
        assert rec["predicted_index"] == list(range(30))  # the dataset's order, each sample once
        np.testing.assert_allclose(rec["predicted"], alone["pred"], rtol=1e-5, atol=1e-6)


@pytest.mark.timeout(3 * LIMIT + 60)
def test_rank_zero_checkpoint_resumes_sample_exactly_under_mpi(tmp_path):
    ckpt, broken, resumed, unbroken = (tmp_path / name for name in ("ckpt", "broken", "resumed", "unbroken"))
    for folder in (broken, resumed, unbroken):
        folder.mkdir()
    code, output, _ = mpirun("checkpoint", str(broken), str(ckpt))
    assert code != 0 and "stopped on purpose" in output
    saved = sorted(p.name for p in ckpt.iterdir() if not p.name.startswith("."))
    assert saved, f"no checkpoint was written: {output[-2000:]}"
    code, output, _ = mpirun("resume", str(resumed), str(ckpt))
    assert code == 0, output[-3000:]
    code, output, _ = mpirun("unbroken", str(unbroken))
    assert code == 0, output[-3000:]
    assert records(resumed)[0]["global_forward_batches"] == records(unbroken)[0]["global_forward_batches"] == 16
    for rank in range(2):
        got, want = params(resumed, rank), params(unbroken, rank)
        for name in want:
            np.testing.assert_array_equal(got[name], want[name], err_msg=f"rank {rank} {name} after resume")


@pytest.mark.timeout(LIMIT + 60)
@pytest.mark.parametrize("mode", ["fail", "kill"])
def test_a_failing_process_stops_the_run_instead_of_hanging(tmp_path, mode):
    code, output, seconds = mpirun(mode, str(tmp_path), timeout=120)
    assert code != 0, output[-3000:]
    if mode == "fail":
        assert "rank 1 fails on purpose" in output
        assert "rank 1 of 2 stopped after CallbackError" in output and "without MPI_Finalize" in output
    assert not (tmp_path / "rank0.json").exists(), "rank 0 finished although its peer died"
    print(f"\nmpirun ({mode}) exited with {code} after {seconds:.1f} s")


@pytest.mark.timeout(LIMIT + 60)
def test_device_list_and_nproc_must_match_the_mpi_world(tmp_path):
    code, output, _ = mpirun("devices", str(tmp_path))
    assert code == 0, output[-3000:]
    for rec in records(tmp_path):
        assert "lists 3 device(s) but mpirun runs 2 process(es)" in rec["device_list"]
        assert "nproc=3 but mpirun started 2 process(es)" in rec["nproc"]


@pytest.mark.timeout(LIMIT + 60)
def test_data_that_cannot_be_shared_out_evenly_is_refused_on_every_process(tmp_path):
    code, output, _ = mpirun("refuse", str(tmp_path))
    # the uneven run failed inside Trainer.run(): although the script caught the error, its processes end
    # with exit code 1 (without MPI_Finalize), since a peer might be waiting in a collective
    assert code == 1 and "stopped after DriverError: epoch 0: the processes have different" in output, output[-3000:]
    for rec in records(tmp_path):
        assert "train_dataloader=list: distributed training gives each of the 2 processes" in rec["plain_list"]
        assert "use_dist_sampler=False" in rec["plain_list"]
        assert "batch_size=7 is the global batch under MPI" in rec["odd_batch"]
        assert "different numbers of training batches (rank 0: 3, rank 1: 4)" in rec["uneven"]
