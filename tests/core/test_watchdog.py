"""The core's watchdog, with no framework: it ends a wait that lasts too long, and only such a wait.

``on_expiry`` is injected everywhere (the default ends the process), and every timeout is
a fraction of a second, so the whole file takes about a second.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable

import pytest

from drivetrain.backend import Watchdog


def wait_until(condition: Callable[[], bool], within: float = 3.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


@pytest.fixture
def made():
    """Watchdogs built in a test, stopped after it (their threads must not outlive it)."""
    dogs: list[Watchdog] = []
    yield dogs
    for dog in dogs:
        dog.stop()
        assert dog._thread is None or not dog._thread.is_alive()


def watchdog(made: list[Watchdog], timeout: float, **options) -> tuple[Watchdog, list[str]]:
    messages: list[str] = []
    dog = Watchdog(1, 4, timeout, on_expiry=messages.append, poll=0.01, **options)
    made.append(dog)
    return dog, messages


def test_an_operation_that_outlasts_the_timeout_is_ended_naming_rank_and_operation(made) -> None:
    dog, messages = watchdog(made, 0.1, limit="mxnet_kwargs['timeout']=0.1 s", advice="Raise it if you must.")
    with dog.watch("barrier()"):
        assert wait_until(lambda: bool(messages))
    assert len(messages) == 1
    message = messages[0]
    assert message.startswith("barrier() on rank 1 of 4: another process did not answer within "
                              "mxnet_kwargs['timeout']=0.1 s (stuck? killed?). Raise it if you must. This process stops")
    time.sleep(0.1)
    assert len(messages) == 1, "on_expiry is called once"
    assert not dog._thread.is_alive()  # the thread ends after expiry


def test_the_default_limit_names_the_seconds(made) -> None:
    dog, messages = watchdog(made, 0.05)
    with dog.watch("an all_gather"):
        assert wait_until(lambda: bool(messages))
    assert "an all_gather on rank 1 of 4: another process did not answer within 0.05 s" in messages[0]


def test_quick_operations_and_idle_time_are_never_ended(made) -> None:
    dog, messages = watchdog(made, 0.3)
    for _ in range(25):  # 25 quick calls add up to more than the timeout: each counts alone
        with dog.watch("the forward"):
            time.sleep(0.02)
    time.sleep(0.6)  # idle (no operation watched) for twice the timeout
    assert messages == []
    assert dog.operation is None
    assert dog._thread.is_alive()


def test_nested_watches_count_as_the_outermost(made) -> None:
    dog, messages = watchdog(made, 0.2)
    with dog.watch("the optimizer step"):
        outer = dog._current
        assert dog.operation == "the optimizer step"
        time.sleep(0.05)
        with dog.watch("an all_reduce"):  # does not restart the clock nor rename the wait
            assert dog._current is outer
            assert wait_until(lambda: bool(messages), within=2.0)
        assert dog.operation == "the optimizer step"  # leaving the inner one does not end the outer
    assert dog.operation is None
    assert messages[0].startswith("the optimizer step on rank 1 of 4")


def test_an_exception_leaves_the_watch(made) -> None:
    dog, messages = watchdog(made, 0.1)
    with pytest.raises(ValueError), dog.watch("the forward"):
        raise ValueError("boom")
    assert dog.operation is None
    time.sleep(0.2)
    assert messages == []


def test_a_peer_that_reported_a_failure_ends_the_wait_after_the_grace(made) -> None:
    reports: dict[int, str] = {}
    dog, messages = watchdog(made, 30.0, peer_reports=lambda: dict(reports), peer_grace=0.1)
    with dog.watch("barrier()"):
        time.sleep(0.2)
        assert messages == []  # nobody reported yet; far from the timeout
        reports[3] = "raised ValueError: boom"
        assert wait_until(lambda: bool(messages), within=3.0)
    assert messages[0].startswith("barrier() cannot finish on rank 1 of 4 because rank 3 raised ValueError: boom.")


def test_a_report_does_not_end_an_operation_that_returns_in_time(made) -> None:
    dog, messages = watchdog(made, 30.0, peer_reports=lambda: {0: "exited with code 3"}, peer_grace=0.3)
    for _ in range(3):
        with dog.watch("barrier()"):
            time.sleep(0.15)  # each call returns within the grace; the grace starts anew for the next
    assert messages == []


def test_the_thread_starts_with_the_first_watch_or_start_and_stop_ends_it() -> None:
    started = threading.Event()
    dog = Watchdog(0, 2, 0.5, on_start=started.set, on_expiry=lambda message: None, poll=0.01)
    assert dog._thread is None  # nothing runs before it is needed
    with dog.watch("the forward"):
        pass
    assert started.wait(2.0), "on_start runs in the thread"
    thread = dog._thread
    assert thread is not None and thread.daemon and thread.is_alive() and thread is not threading.current_thread()
    dog.stop()
    assert not thread.is_alive()

    explicit = Watchdog(0, 2, 0.5, on_expiry=lambda message: None, poll=0.01)
    explicit.start()
    explicit.start()  # once only
    assert explicit._thread.is_alive()
    explicit.stop()
    assert not explicit._thread.is_alive()
    assert [t for t in threading.enumerate() if t.name == "drivetrain-watchdog"] == []


@pytest.mark.parametrize("linger", [0.0, 0.5])
def test_the_default_end_says_why_first_then_exits_with_code_1_after_the_linger(linger) -> None:
    code = f"from drivetrain.backend import end_process; end_process('barrier() on rank 1 of 2: stuck', linger={linger})"
    child = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True)
    try:
        line = child.stderr.readline()  # out before the pause
        said = time.monotonic()
        assert line == "drivetrain: DistributedError: barrier() on rank 1 of 2: stuck\n"
        assert child.wait(timeout=30) == 1
        assert time.monotonic() - said >= linger * 0.9
    finally:
        child.kill()
        child.stderr.close()
