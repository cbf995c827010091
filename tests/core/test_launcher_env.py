"""The core's launcher-environment parser and shared layout checks (drivetrain.backend), framework-free."""

from __future__ import annotations

import pytest

from drivetrain.backend import (
    DriverError,
    LauncherEnv,
    LauncherVars,
    check_launched_layout,
    one_gpu_for_many,
    plan_options,
    read_launcher_env,
)

RUN = LauncherVars(rank="R", world_size="W", local_rank=("LR", "LR_OLD"), local_world_size="LW",
                   hint="Start with mylaunch", start="mylaunch -n {n} train.py", needed_when_many=("ADDR",),
                   rank_word="the id", local_rank_word="the local rank", gpu="gpu")
PLAIN = LauncherVars(rank="R", world_size="W", local_rank=("LR",), local_world_size="LW", hint="Use it",
                     start="go {n}")
_VARS = ("R", "W", "LR", "LR_OLD", "LW", "ADDR")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _VARS:
        monkeypatch.delenv(name, raising=False)


def _set(monkeypatch: pytest.MonkeyPatch, **values: str) -> None:
    for name, value in values.items():
        monkeypatch.setenv(name, value)


def test_not_launched_is_none() -> None:
    assert read_launcher_env(RUN) is None


def test_a_full_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    _set(monkeypatch, R="3", W="4", LR="1", LW="2", ADDR="host:1")
    assert read_launcher_env(RUN) == LauncherEnv(3, 4, 1, 2)


def test_local_rank_falls_back_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    _set(monkeypatch, R="1", W="2", ADDR="h")
    assert read_launcher_env(RUN) == LauncherEnv(1, 2, 1, 2)  # neither set: the global rank
    _set(monkeypatch, LR_OLD="0")
    assert read_launcher_env(RUN).local_rank == 0
    _set(monkeypatch, LR="1")
    assert read_launcher_env(RUN).local_rank == 1


@pytest.mark.parametrize(("env", "message"), [
    ({"R": "0"}, "R='0' is set in the environment but W is not. Start with mylaunch (or unset it"),
    ({"W": "2"}, "W='2' is set in the environment but R is not"),
    ({"R": "2", "W": "2"}, "R=2, W=2; the id must be in 0..W-1. Start with mylaunch."),
    ({"R": "x", "W": "2"}, "R='x' is not an integer. Start with mylaunch."),
    ({"R": "0", "W": "2", "LR": "2", "LW": "2"}, "LR=2, LW=2; the local rank must be in 0..LW-1."),
    ({"R": "0", "W": "2"}, "W=2 but ADDR not set. Start with mylaunch."),
    ({"R": "0", "W": "2", "ADDR": ""}, "W=2 but ADDR not set."),
])
def test_refusals(monkeypatch: pytest.MonkeyPatch, env: dict[str, str], message: str) -> None:
    _set(monkeypatch, **env)
    with pytest.raises(DriverError) as info:
        read_launcher_env(RUN)
    assert message in str(info.value)


def test_default_words_are_the_variable_names(monkeypatch: pytest.MonkeyPatch) -> None:
    _set(monkeypatch, R="5", W="2")
    with pytest.raises(DriverError, match=r"R must be in 0\.\.W-1"):
        read_launcher_env(PLAIN)
    _set(monkeypatch, R="0", W="1")
    assert read_launcher_env(PLAIN) == LauncherEnv(0, 1, 0, 1)  # one process: nothing else needed


def test_check_launched_layout() -> None:
    env = LauncherEnv(0, 4, 0, 2)
    check_launched_layout(None, "gpu", env, RUN)
    check_launched_layout(4, [0, 1], env, RUN)
    with pytest.raises(DriverError, match=r"nproc=3 .* \(W=4\); .* e\.g\. mylaunch -n 3 train\.py"):
        check_launched_layout(3, None, env, RUN)
    with pytest.raises(DriverError) as info:
        check_launched_layout(None, [0, 1, 2], env, RUN)
    assert str(info.value) == (
        "device=[0, 1, 2] lists 3 device(s) but this machine runs 2 process(es) (LW); list one device per "
        "process, or pass device='gpu' to give each process the GPU of its local rank.")
    with pytest.raises(DriverError, match="device='cuda' to give each process the GPU of its LR"):
        check_launched_layout(None, [0], env, PLAIN)


def test_one_gpu_for_many() -> None:
    assert str(one_gpu_for_many("gpu:0", 2, RUN, spawn=True)) == (
        "device='gpu:0' names one GPU but nproc=2 asks for 2 processes; pass device=[0, 1] (the GPUs to use) "
        "or device='gpu' (GPUs 0..1).")
    assert str(one_gpu_for_many("cuda:1", 3, PLAIN, spawn=False)) == (
        "device='cuda:1' names one GPU, but 3 processes run on this machine and would all use it; pass "
        "device='cuda' (each process takes the GPU of its LR) or a list such as device=[0, 1, 2].")


def test_plan_options() -> None:
    assert plan_options({}, default_timeout=30.0, argument="x_kwargs") == {
        "timeout": 30.0, "even_batches": False, "spawn_output": "inherit"}
    given = {"timeout": 5, "even_batches": True, "spawn_output": "prefix", "other": 1}
    assert plan_options(given, default_timeout=30.0, argument="x_kwargs") == {
        "timeout": 5.0, "even_batches": True, "spawn_output": "prefix"}
    with pytest.raises(DriverError, match=r"x_kwargs\['even_batches'\]='yes' must be True or False"):
        plan_options({"even_batches": "yes"}, default_timeout=1.0, argument="x_kwargs")
    with pytest.raises(DriverError, match=r"x_kwargs\['spawn_output'\]='tee' is not accepted"):
        plan_options({"spawn_output": "tee"}, default_timeout=1.0, argument="x_kwargs")
    with pytest.raises(DriverError, match=r"x_kwargs\['timeout'\]=0 is not accepted"):
        plan_options({"timeout": 0}, default_timeout=1.0, argument="x_kwargs")
