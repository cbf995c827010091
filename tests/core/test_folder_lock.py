"""Two runs in one checkpoint folder (issue 39, part 4): the second refuses at start, naming the first (host,
pid, start time); a lock left by a run killed with SIGKILL is taken over, with a line saying so. Real
processes: the first run is a child process training slowly."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from drivetrain import CheckpointCallback, CheckpointError, Trainer
from drivetrain_numpy import SGD, ArrayLoader, LinearModel

from .conftest import make_regression

SCRIPT = Path(__file__).with_name("_lock_script.py")


def _trainer(folder: Path) -> Trainer:
    model = LinearModel(3, 1)
    return Trainer(model, ArrayLoader(make_regression(), batch_size=8), SGD(model.params, model.grads, lr=0.05),
                   driver="numpy", n_epochs=2, progress_bar=None,
                   callbacks=[CheckpointCallback(folder, every_n_batches=4)])


def _start_first(tmp_path: Path) -> subprocess.Popen:
    marker = tmp_path / "started"
    log = tmp_path / "first.log"
    with open(log, "wb") as out:
        first = subprocess.Popen([sys.executable, str(SCRIPT), str(tmp_path / "ckpt"), str(marker)], stdout=out,
                                 stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while not marker.exists():
        assert first.poll() is None, log.read_text()
        assert time.monotonic() < deadline, "the first run did not start"
        time.sleep(0.05)
    return first


def test_a_second_run_in_the_folder_refuses_naming_the_first_and_a_killed_runs_lock_is_taken_over(
        tmp_path, caplog) -> None:
    first = _start_first(tmp_path)
    try:
        second = _trainer(tmp_path / "ckpt")
        with pytest.raises(CheckpointError, match=rf"in use by another run \(host {socket.gethostname()}, pid "
                                                  rf"{first.pid}, started 20\d\d-.*CheckpointCallback\(folder="):
            second.run(resume_from="latest")
        assert first.poll() is None  # the first run goes on, its folder untouched
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(30)

    third = _trainer(tmp_path / "ckpt")
    with caplog.at_level(logging.WARNING, logger="drivetrain"):
        third.run(resume_from="latest")
    assert f"taking over the lock of a run that ended without releasing it (host {socket.gethostname()}, pid " \
           f"{first.pid}" in caplog.text
    assert third.global_forward_batches == 16
    assert not (tmp_path / "ckpt" / ".drivetrain-run.lock").exists()  # a normal end leaves no lock
    assert os.listdir(tmp_path / "ckpt")
