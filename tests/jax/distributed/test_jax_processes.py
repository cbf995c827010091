"""The JAX driver on two processes (CPU, gloo): three launches, each about ten seconds.

1. ``nproc=2`` from a plain ``python`` run: the parameters equal one process training on the whole global batches
   (within float rounding: the mean of two halves), gradients are exchanged once per accumulation cycle, the
   collectives answer (an int64 of 2**40 summed exactly: no truncation by JAX's 32-bit default), evaluation shards
   add up to one process's accuracy; the run's 2-process checkpoint resumes in one process (2 -> 1).
2. ``python -m drivetrain_jax.run --nproc_per_node 2`` (the documented launcher line): the run with dropout and
   batch norm resumed from a mid-epoch checkpoint ends bit-identical to the unbroken run.
3. ``torchrun -m drivetrain_jax.run`` (when torch is installed): a rank that fails ends the others within
   ``jax_kwargs['timeout']``.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from ..._dist_helpers import ProcessGroup
from . import _jax_script as script

pytestmark = [pytest.mark.distributed, pytest.mark.jax]


def env() -> dict[str, str]:
    launch = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "DRIVETRAIN_SPAWN")
    return {**{k: v for k, v in os.environ.items() if not k.startswith(launch)}, "PYTHONUNBUFFERED": "1",
            "JAX_PLATFORMS": "cpu", "OMP_NUM_THREADS": "1"}


def launch(tmp_path: Path, name: str, *cmd: str, timeout: float = 180):
    group = ProcessGroup(list(cmd), tmp_path, env(), name, cwd=tmp_path)
    try:
        return group.wait(timeout)
    finally:
        group.close()  # whatever the command left running, and its log file


def states(path: Path) -> dict[str, np.ndarray]:
    return dict(np.load(path))


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("jax-dist")
    done = launch(out, "train", sys.executable, script.__file__, str(out), "train")
    assert done.returncode == 0, done.output[-4000:]
    return out


def test_two_processes_average_once_per_cycle_and_match_one_process_on_the_global_batch(trained):
    records = [json.loads((trained / f"train-{r}.json").read_text()) for r in (0, 1)]
    assert [r["rank"] for r in records] == [0, 1] and "rank 1/2 backend=gloo" in records[1]["describe"]
    # 96 samples, 16 per global batch: 6 batches an epoch in cycles of 2, exchanged in batches 2, 4, 6 of each epoch
    # (global_forward_batches counts the batches before the current one)
    assert records[0]["exchanges"] == records[1]["exchanges"] == [1, 3, 5, 7, 9, 11]
    assert records[0]["sum"] == [2 * 2**40 + 1]  # int64 through the object collectives, exact
    assert records[0]["gathered"] == [{"rank": 0}, {"rank": 1}] and records[0]["broadcast"] == 11
    one = script.trainer(2 * script.PER_RANK, evaluate_dataloaders={"dev": script.DataLoader(script.data(1), 10)},
                         metrics={"acc": script.Accuracy()})
    one.run()
    want, got = {k: np.asarray(v) for k, v in one.driver.model_state().items()}, states(trained / "train.npz")
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6, err_msg=name)
    assert records[0]["eval"] == records[1]["eval"] == pytest.approx(one.evaluate(), abs=1e-9)

    # 2 -> 1: the checkpoint of step 8 (epoch 1, 32 of its 96 samples read) resumes in one process, which reads
    # the other 64 in 8 batches of 8
    alone = script.trainer(script.PER_RANK, 0.3)
    alone.run(resume_from=sorted(glob.glob(str(trained / "ckpt-0.3" / "step_00000008*")))[0])
    assert alone.global_forward_batches == 16


def test_the_launcher_line_resumes_a_mid_epoch_checkpoint_bit_exactly(trained):
    done = launch(trained, "resume", sys.executable, "-m", "drivetrain_jax.run", "--nproc_per_node", "2",
                  script.__file__, str(trained), "resume")
    assert done.returncode == 0, done.output[-4000:]
    want, got = states(trained / "dropout.npz"), states(trained / "resume.npz")
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def test_a_failing_rank_ends_the_others_within_the_timeout(tmp_path):
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable))
    cmd = [torchrun, "--nproc_per_node", "2", "-m", "drivetrain_jax.run"] if torchrun else [sys.executable]
    done = launch(tmp_path, "fail", *cmd, script.__file__, str(tmp_path), "fail", timeout=120)
    assert done.returncode != 0
    assert "rank 1 of 2 failed: CallbackError" in done.output and "rank 1 fails on purpose" in done.output
    assert "the gradient average on rank 0 of 2" in done.output, done.output[-4000:]
    assert done.seconds < 60, done.output[-3000:]  # start-up (~10 s) + the 10 s timeout, with room
