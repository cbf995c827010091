"""The framework-free helpers that sharded engines share (FSDP in drivetrain-torch, ZeRO in drivetrain-deepspeed):
optimizer state by name or by index, and the checks before a sharded load. The drivers that use them are
tested on real processes in tests/torch/distributed; here each rule is pinned on plain data."""

from __future__ import annotations

import numpy as np
import pytest

from drivetrain import CheckpointError
from drivetrain.backend import (
    MODEL_PREFIX,
    ShardSource,
    check_shard_model,
    check_shard_optimizers,
    optimizer_state_by_index,
    optimizer_state_by_name,
)

BY_INDEX = {
    "state": {0: {"step": 3, "exp_avg": np.ones(2)}, 2: {"step": 3, "exp_avg": np.zeros(4)}},
    "param_groups": [{"lr": 0.1, "params": [0, 1]}, {"lr": 0.01, "params": [2]}],
}
ORDER = ["encoder.weight", "encoder.bias", "head.weight"]


def test_optimizer_state_goes_to_names_and_back() -> None:
    named = optimizer_state_by_name(BY_INDEX, ORDER)
    assert list(named["state"]) == ["encoder.weight", "head.weight"]
    assert [g["params"] for g in named["param_groups"]] == [["encoder.weight", "encoder.bias"], ["head.weight"]]
    assert [g["lr"] for g in named["param_groups"]] == [0.1, 0.01]
    back = optimizer_state_by_index(named)
    assert back["param_groups"] == BY_INDEX["param_groups"]
    assert list(back["state"]) == [0, 2] and back["state"][2]["exp_avg"] is BY_INDEX["state"][2]["exp_avg"]


def test_string_indices_of_a_json_round_trip_are_read_as_ints() -> None:
    stringly = {"state": {"1": {"step": 1}}, "param_groups": [{"lr": 0.1, "params": ["0", "1"]}]}
    named = optimizer_state_by_name(stringly, ["a", "b"])
    assert named["state"] == {"b": {"step": 1}} and named["param_groups"][0]["params"] == ["a", "b"]


def test_by_index_numbers_parameters_in_the_order_of_the_groups() -> None:
    named = {"state": {"z": {"step": 1}}, "param_groups": [{"params": ["y", "z"]}, {"params": ["x"]}]}
    assert optimizer_state_by_index(named)["state"] == {1: {"step": 1}}


def _source(meta: object = None) -> ShardSource:
    entry = {"dtype": "F32", "shape": [2, 3], "chunks": [{"file": "f0", "offsets": [0, 0], "sizes": [2, 3]}]}
    return ShardSource("/ckpt", {MODEL_PREFIX + "w": entry, MODEL_PREFIX + "b": {**entry, "shape": [3]}}, meta, 1,
                       frozen=["frozen"])


def test_the_model_check_names_missing_unexpected_and_reshaped_tensors() -> None:
    source = _source()
    check_shard_model({"w": np.zeros((2, 3)), "b": np.zeros(3), "frozen": np.zeros(1)}, source)  # frozen: left out
    with pytest.raises(CheckpointError, match=r"missing \['extra'\], unexpected \['b'\]"):
        check_shard_model({"w": np.zeros((2, 3)), "extra": np.zeros(3)}, source)
    with pytest.raises(CheckpointError, match=r"shapes differ \(name, saved, model\): \[\('w', \(2, 3\), \(3, 2\)\)\]"):
        check_shard_model({"w": np.zeros((3, 2)), "b": np.zeros(3)}, source)


def test_the_optimizer_check_compares_groups_by_parameter_name() -> None:
    meta = {"optimizers": [{"param_groups": [{"lr": 0.1, "params": ["w", "b"]}], "tensors": {}, "values": {}}]}
    assert check_shard_optimizers(_source(meta), [[["w", "b"]]]) == meta["optimizers"]
    with pytest.raises(CheckpointError, match=r"optimizers\[0\] was saved over other parameters or groups \(saved "
                                              r"groups \[2\] parameters, this one \[1, 1\]\)"):
        check_shard_optimizers(_source(meta), [[["w"], ["b"]]])
    with pytest.raises(CheckpointError, match=r"holds 1 optimizer state\(s\) but the trainer has 2 optimizer\(s\)"):
        check_shard_optimizers(_source(meta), [[["w", "b"]], [["w"]]])
    with pytest.raises(CheckpointError, match=r"holds no optimizer state\(s\)"):
        check_shard_optimizers(_source(None), [[["w", "b"]]])
