"""The socket-free store of a run on one machine (``drivetrain.backend.FolderStore``), without a framework.

Counters stay exact when processes add at once, readers never see half a value, the folder
is private, ``get`` gives up naming the key, and folders of runs whose first process died are
removed by the next run.
"""

from __future__ import annotations

import multiprocessing
import os
import stat
import subprocess
import sys
import threading

import pytest

from drivetrain._distributed.folder_store import FOLDER_PREFIX, _remove_orphans
from drivetrain._distributed.spawn import FailureBoard
from drivetrain.backend import FolderStore

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="counts on fork and POSIX pids")


@pytest.fixture
def store(tmp_path):
    folder = tmp_path / "store"
    folder.mkdir(mode=0o700)
    return FolderStore(str(folder), timeout=0.2)


def _add_many(folder: str, times: int) -> None:
    store = FolderStore(folder)
    for _ in range(times):
        store.add("count", 1)


def test_set_get_check_and_add(store) -> None:
    assert not store.check(["a"]) and store.add("n", 0) == 0
    store.set("a/with/slashes", "one")
    store.set("a/with/slashes", "two")  # replaced whole
    assert store.check(["a/with/slashes"]) and store.get("a/with/slashes") == b"two"
    assert store.add("n", 3) == 3 and store.add("n", 0) == 3 and store.add("n", -1) == 2
    assert store.check(["n"]) and not store.check(["n", "missing"])
    store.set("k" * 300, "long keys too")
    assert store.get("k" * 300) == b"long keys too"


def test_get_waits_then_names_the_missing_key(store) -> None:
    with pytest.raises(TimeoutError, match="no process set 'missing'"):
        store.get("missing")


def test_counters_stay_exact_when_processes_add_together(store) -> None:
    fork = multiprocessing.get_context("fork")
    workers = [fork.Process(target=_add_many, args=(store.folder, 50)) for _ in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=30)
    assert [w.exitcode for w in workers] == [0] * 4
    assert store.add("count", 0) == 200


def test_it_carries_the_failure_board(store) -> None:
    """What the board of a run the Trainer started does with it: post, count, read another rank's notice."""
    rank1 = FailureBoard(store, rank=1, world_size=2, generation=7)
    rank0 = FailureBoard(store, rank=0, world_size=2, generation=7)
    rank1.post_failure("raised ValueError: boom")
    assert rank0.reports() == {1: "raised ValueError: boom"}
    # rank 1 stopped waiting: rank 0 failing later learns that they do not stand together (same verdict)
    assert rank1.all_failed(grace=0.0) is False and rank0.all_failed(grace=0.0) is False


def test_ranks_failing_together_agree_on_it(store) -> None:
    """Ranks failing within the grace all see every rank failed (collectives stay allowed on the way out)."""
    boards = [FailureBoard(store, rank=r, world_size=2, generation=8) for r in (0, 1)]
    verdicts: dict[int, bool] = {}
    waiting = threading.Thread(target=lambda: verdicts.__setitem__(1, boards[1].all_failed(grace=30.0)))
    waiting.start()
    verdicts[0] = boards[0].all_failed(grace=30.0)
    waiting.join(timeout=30)
    assert verdicts == {0: True, 1: True}


def test_created_folders_are_private_and_removed(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    store = FolderStore.create()
    assert os.path.basename(store.folder).startswith(f"{FOLDER_PREFIX}{os.getpid()}-")
    assert stat.S_IMODE(os.stat(store.folder).st_mode) == 0o700
    store.remove()
    assert not os.path.exists(store.folder)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        FolderStore(store.folder)


def test_folders_whose_maker_died_are_removed_by_the_next_run(tmp_path) -> None:
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                           check=True)
    dead = tmp_path / f"{FOLDER_PREFIX}{ended.stdout.strip()}-x"
    alive = tmp_path / f"{FOLDER_PREFIX}{os.getpid()}-y"
    other = tmp_path / "unrelated-123-z"
    for folder in (dead, alive, other):
        folder.mkdir()
    _remove_orphans(str(tmp_path))
    assert not dead.exists() and alive.exists() and other.exists()
