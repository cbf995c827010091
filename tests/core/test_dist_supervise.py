"""The core's supervising launcher (``Launcher.supervise``) and the pickled object collectives, without a framework."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from drivetrain._common.errors import DriverError
from drivetrain._distributed.objects import broadcast_pickled, gather_pickled, reduce_gathered
from drivetrain._distributed.spawn import Launcher, local_launch_env

EXIT_WITH_RANK = "import os, sys, time; rank = int(os.environ['RANK']); time.sleep(0.3 * rank); sys.exit(rank)"
ONE_FAILS_ONE_HANGS = "import os, sys, time; rank = int(os.environ['RANK']); sys.exit(1) if rank else time.sleep(60)"


def _supervise(code: str, timeout: float = 5.0) -> int:
    launcher = Launcher(2, timeout, "inherit", [sys.executable, "-c", code], timeout_option="x_kwargs['timeout']")
    with pytest.raises(SystemExit) as stop:
        launcher.supervise(lambda rank: local_launch_env(rank, 2, 1))
    return int(stop.value.code)


def test_every_worker_succeeding_exits_zero(capfd) -> None:
    assert _supervise("import sys; sys.exit(0)") == 0
    assert "drivetrain:" not in capfd.readouterr().err


def test_a_failed_worker_is_named_and_the_supervisor_exits_one(capfd) -> None:
    assert _supervise(EXIT_WITH_RANK) == 1
    err = capfd.readouterr().err
    assert "drivetrain: rank 1 of 2 exited with code 1; the other processes stop too (killed if still running " \
           "after x_kwargs['timeout']=5 s)." in err
    assert "drivetrain: the distributed run failed: rank 1 exited with code 1." in err


def test_the_others_are_stopped_after_the_timeout(capfd) -> None:
    assert _supervise(ONE_FAILS_ONE_HANGS, timeout=0.5) == 1
    err = capfd.readouterr().err
    assert "rank 0 was killed by SIGTERM (exit code -15) (stopped by the supervisor)" in err


def test_pickled_objects_travel_through_array_collectives() -> None:
    sent = {"a": [1, 2], "b": "x" * 50}
    arrays: list[np.ndarray] = []  # what rank 0 (the source) broadcasts, replayed to rank 1
    assert broadcast_pickled(sent, 0, 0, lambda array, src: arrays.append(array.copy()) or array) is sent
    replay = iter(arrays)
    assert broadcast_pickled(None, 0, 1, lambda array, src: next(replay)) == sent
    assert gather_pickled(sent, lambda array: [array, array]) == [sent, sent]


def test_reduce_gathered_reduces_in_rank_order_and_refuses_different_shapes() -> None:
    parts = [np.array([1, 5]), np.array([3, 2])]
    assert reduce_gathered(parts, "sum").tolist() == [4, 7]
    assert reduce_gathered(parts, "max").tolist() == [3, 5]
    with pytest.raises(DriverError, match="arrays of different shapes"):
        reduce_gathered([np.zeros(2), np.zeros(3)], "min")
