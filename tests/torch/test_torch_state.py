"""Model state and tensor files: safetensors round trips, tied weights, strict loading, no pickle."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
import torch

from drivetrain._common.errors import DriverError


class TiedNet(torch.nn.Module):
    """An embedding tied to the output projection, plus a bf16 buffer and an integer buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)
        self.out = torch.nn.Linear(4, 10, bias=False)
        self.out.weight = self.embed.weight
        self.register_buffer("scale", torch.randn(3).to(torch.bfloat16))
        self.register_buffer("steps", torch.tensor(12, dtype=torch.int64))


def _header(path) -> dict:
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(size))


def test_model_state_is_flat_and_detached(model, make_driver) -> None:
    d = make_driver(model)
    state = d.model_state()
    assert sorted(state) == ["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"]
    assert all(isinstance(t, torch.Tensor) and not t.requires_grad for t in state.values())


def test_round_trip_restores_the_model(model, make_driver, tiny_net_cls, batches, tmp_path) -> None:
    d = make_driver(model)
    path = tmp_path / "model.safetensors"
    d.save_tensors(d.model_state(), str(path))
    other = tiny_net_cls()
    d2 = make_driver(other)
    d2.load_model_state(d2.load_tensors(str(path)))
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, other.state_dict()[name]), name
    assert torch.equal(model(batches[0]["x"])["logits"], other(batches[0]["x"])["logits"])


def test_bf16_and_tied_weights_round_trip_exactly(make_driver, tmp_path) -> None:
    torch.manual_seed(1)
    model = TiedNet()
    d = make_driver(model)
    state = d.model_state()
    assert state["embed.weight"].data_ptr() == state["out.weight"].data_ptr()  # tied in memory
    path = tmp_path / "tied.safetensors"
    d.save_tensors(state, path)

    loaded = d.load_tensors(path)
    assert loaded["scale"].dtype == torch.bfloat16
    assert torch.equal(loaded["scale"].view(torch.int16), model.scale.view(torch.int16))  # bit-exact
    assert loaded["steps"].dtype == torch.int64 and int(loaded["steps"]) == 12
    assert torch.equal(loaded["embed.weight"], loaded["out.weight"])

    torch.manual_seed(2)
    fresh = TiedNet()
    d2 = make_driver(fresh)
    d2.load_model_state(loaded)
    assert fresh.out.weight is fresh.embed.weight  # still tied after loading
    assert torch.equal(fresh.embed.weight, model.embed.weight)
    assert torch.equal(fresh.scale.view(torch.int16), model.scale.view(torch.int16))


def test_file_is_safetensors_not_pickle(model, make_driver, tmp_path) -> None:
    d = make_driver(model)
    path = tmp_path / "state.safetensors"
    d.save_tensors(d.model_state(), path)
    raw = path.read_bytes()
    assert not raw.startswith(b"\x80")  # pickle protocol 2+ opcode
    assert b"PK\x03\x04" not in raw[:4]  # torch.save's zip container
    header = _header(path)
    assert header["fc1.weight"]["dtype"] == "F32" and header["fc1.weight"]["shape"] == [8, 4]


def test_save_tensors_handles_views_numpy_and_non_contiguous(make_driver, model, tmp_path) -> None:
    d = make_driver(model)
    base = torch.arange(12.0).reshape(3, 4)
    tensors = {
        "base": base,
        "row": base[1],  # shares memory with base
        "transposed": base.t(),  # non-contiguous view
        "array": np.arange(3, dtype=np.int32),
        "grad": torch.ones(2, requires_grad=True),
    }
    d.save_tensors(tensors, tmp_path / "mixed.safetensors")
    loaded = d.load_tensors(tmp_path / "mixed.safetensors")
    assert torch.equal(loaded["row"], base[1])
    assert torch.equal(loaded["transposed"], base.t())
    assert loaded["array"].dtype == torch.int32
    assert not loaded["grad"].requires_grad


def test_save_tensors_rejects_what_is_not_a_tensor(model, make_driver, tmp_path) -> None:
    d = make_driver(model)
    with pytest.raises(DriverError, match="'lr' is a float, not a torch tensor"):
        d.save_tensors({"lr": 0.1}, tmp_path / "bad.safetensors")
    with pytest.raises(DriverError, match="tensor names must be str"):
        d.save_tensors({1: torch.zeros(1)}, tmp_path / "bad.safetensors")


def test_load_tensors_errors(model, make_driver, tmp_path) -> None:
    d = make_driver(model)
    with pytest.raises((DriverError, FileNotFoundError), match="absent.safetensors"):  # the core reads the file
        d.load_tensors(tmp_path / "absent.safetensors")
    broken = tmp_path / "broken.safetensors"
    broken.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    with pytest.raises(DriverError, match="not a readable safetensors file"):
        d.load_tensors(broken)


def test_load_model_state_with_wrong_keys_lists_them(model, make_driver) -> None:
    d = make_driver(model)
    state = d.model_state()
    state["fc3.weight"] = state.pop("fc2.weight")
    with pytest.raises(DriverError) as info:
        d.load_model_state(state)
    message = str(info.value)
    assert "missing key(s) ['fc2.weight']" in message
    assert "unexpected key(s) ['fc3.weight']" in message
    assert "TinyNet" in message


def test_load_model_state_with_wrong_shape(model, make_driver) -> None:
    d = make_driver(model)
    state = d.model_state()
    state["fc1.weight"] = torch.zeros(3, 3)
    with pytest.raises(DriverError, match=r"state\['fc1.weight'\] has shape \(3, 3\) but .* \(8, 4\)"):
        d.load_model_state(state)


def test_load_model_state_accepts_numpy_arrays(model, make_driver, tiny_net_cls) -> None:
    d = make_driver(model)
    as_numpy = {k: d.tensor_to_numpy(v) for k, v in d.model_state().items()}
    other = tiny_net_cls()
    make_driver(other).load_model_state(as_numpy)
    assert torch.equal(other.fc1.weight, model.fc1.weight)
    with pytest.raises(DriverError, match=r"state\['fc1.bias'\] is a list"):
        d.load_model_state({**as_numpy, "fc1.bias": [0.0] * 8})


@pytest.mark.gpu
def test_gpu_model_round_trips_through_the_cpu_file(make_driver, tmp_path) -> None:
    torch.manual_seed(3)
    model = TiedNet()
    d = make_driver(model, "cuda")
    d.setup()
    d.save_tensors(d.model_state(), tmp_path / "gpu.safetensors")
    loaded = d.load_tensors(tmp_path / "gpu.safetensors")
    assert all(t.device.type == "cpu" for t in loaded.values())
    fresh = TiedNet().to("cuda")
    make_driver(fresh, None).load_model_state(loaded)
    assert fresh.out.weight is fresh.embed.weight
    assert torch.equal(fresh.embed.weight, model.embed.weight)
    assert torch.equal(fresh.scale.view(torch.int16), model.scale.view(torch.int16))
