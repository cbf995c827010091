"""torch tensors through the core's streaming safetensors writer: bit-exact, no needless copies."""

from __future__ import annotations

import hashlib
import json
import struct

import numpy as np
import pytest
import safetensors.torch
import torch

from drivetrain import Trainer
from drivetrain._common.errors import DriverError
from drivetrain._format import safetensors_writer as writer


class Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(6, 3)
        self.out = torch.nn.Linear(3, 6, bias=False)
        self.out.weight = self.embed.weight
        self.register_buffer("mask", torch.tensor([True, False, True]))
        self.register_buffer("scale", torch.randn(3).to(torch.bfloat16))

    def forward(self, x):
        return {"loss": self.out(self.embed(x)).float().square().mean()}


def random_tensor(dtype: torch.dtype, shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    """Random bits of ``dtype`` (NaN payloads included) so bit-exactness is really tested."""
    gen = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    size = torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(0, 256, (int(np.prod(shape)) * size,), generator=gen, dtype=torch.uint8)
    return raw.view(dtype).reshape(shape)


def bits(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
          torch.int8, torch.uint8, torch.bool, torch.complex64, torch.float8_e4m3fn, torch.float8_e5m2]


def every_dtype() -> dict[str, torch.Tensor]:
    tensors = {}
    for i, dtype in enumerate(DTYPES):
        name = str(dtype).removeprefix("torch.")
        tensors[f"{name}/m"] = random_tensor(dtype, (3, 4), seed=i)
        tensors[f"{name}/0d"] = random_tensor(dtype, (), seed=50 + i)
        tensors[f"{name}/empty"] = random_tensor(dtype, (0, 2), seed=0)
    return tensors


def assert_bit_equal(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert set(got) == set(expected)
    for name, tensor in expected.items():
        assert got[name].dtype == tensor.dtype and got[name].shape == tensor.shape, name
        assert bits(got[name]) == bits(tensor), name


def test_every_dtype_round_trips_bit_exactly_and_matches_safetensors(make_driver, model, tmp_path) -> None:
    d = make_driver(model)
    tensors = every_dtype()
    d.save_tensors(tensors, tmp_path / "all.safetensors")
    data = (tmp_path / "all.safetensors").read_bytes()
    assert data == safetensors.torch.save(tensors)  # byte-identical to the library
    assert_bit_equal(safetensors.torch.load(data), tensors)
    assert_bit_equal(d.tensors_from_bytes(data), tensors)


def test_bf16_nan_payloads_survive(make_driver, model) -> None:
    payload = torch.tensor([0x7FC1, 0x7F81, -0x0001, 0x0001, -0x8000], dtype=torch.int16).view(torch.bfloat16)
    d = make_driver(model)
    dtype, shape, data = d.tensor_buffer(payload)
    assert (dtype, shape) == ("BF16", (5,)) and data.tobytes() == bits(payload)
    loaded = d.tensors_from_bytes(writer.encode(d.tensor_file({"p": payload})))["p"]
    assert torch.equal(loaded.view(torch.int16), payload.view(torch.int16))


def test_contiguous_cpu_tensors_are_not_copied(make_driver, model) -> None:
    d = make_driver(model)
    state = d.model_state()
    assert state["fc1.weight"].data_ptr() == model.fc1.weight.data_ptr()  # model_state is a view
    _, _, data = d.tensor_buffer(state["fc1.weight"])
    assert np.frombuffer(data, np.uint8).ctypes.data == model.fc1.weight.data_ptr()


def test_views_non_contiguous_and_tied_tensors_are_written_as_values(make_driver, model) -> None:
    base = random_tensor(torch.float32, (4, 6), seed=3)
    tensors = {"base": base, "row": base[1], "t": base.t(), "strided": base[:, ::2], "offset": base.view(-1)[5:9],
               "conj": random_tensor(torch.complex64, (3,), seed=4).conj(), "neg": base._neg_view()}
    d = make_driver(model)
    loaded = d.tensors_from_bytes(writer.encode(d.tensor_file(tensors)))
    for name, tensor in tensors.items():
        assert torch.equal(loaded[name], tensor.resolve_conj().resolve_neg()), name
        assert loaded[name].is_contiguous()


def test_tied_model_saves_both_names_and_loads_back_tied(make_driver, tmp_path) -> None:
    torch.manual_seed(5)
    model = Tied()
    d = make_driver(model)
    d.save_tensors(d.model_state(), tmp_path / "tied.safetensors")
    raw = (tmp_path / "tied.safetensors").read_bytes()
    (size,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + size])
    assert header["embed.weight"]["data_offsets"] != header["out.weight"]["data_offsets"]  # two full copies
    assert header["mask"]["dtype"] == "BOOL" and header["scale"]["dtype"] == "BF16"
    torch.manual_seed(6)
    fresh = Tied()
    make_driver(fresh).load_model_state(make_driver(fresh).load_tensors(tmp_path / "tied.safetensors"))
    assert fresh.out.weight is fresh.embed.weight
    assert torch.equal(fresh.embed.weight, model.embed.weight)
    assert torch.equal(fresh.mask, model.mask)
    assert bits(fresh.scale) == bits(model.scale)


def test_checkpoint_files_load_with_safetensors_and_match_their_hashes(tmp_path) -> None:
    torch.manual_seed(7)
    model = Tied()
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    trainer = Trainer(model, [{"x": torch.tensor([1, 2])}], opt, driver="torch", device="cpu", progress_bar=None)
    trainer.run()
    folder = trainer.save_checkpoint(tmp_path / "ckpt")
    manifest = json.loads((tmp_path / "ckpt" / "manifest.json").read_text())
    for name, record in manifest["files"].items():
        data = (tmp_path / "ckpt" / name).read_bytes()
        assert record == {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}, name
    weights = safetensors.torch.load_file(f"{folder}/model.safetensors")
    assert_bit_equal(weights, {k: v for k, v in model.state_dict().items()})
    state = safetensors.torch.load_file(f"{folder}/training_state.safetensors")
    assert any(t.dtype == torch.float32 and t.numel() == 18 for t in state.values())  # Adam moments


def test_what_cannot_be_stored_is_refused_with_the_fix(make_driver, model) -> None:
    d = make_driver(model)
    with pytest.raises(DriverError, match=r"save_tensors: 's' has layout .*to_dense"):
        d.tensor_file({"s": torch.eye(3).to_sparse()})
    with pytest.raises(DriverError, match="save_tensors: 'n' is a list, not a torch tensor"):
        d.tensor_file({"n": [1.0]})
    with pytest.raises(DriverError, match=r"save_tensors: 'c' has dtype torch.complex128, which safetensors cannot"):
        d.tensor_file({"c": torch.zeros(2, dtype=torch.complex128)})


def test_numpy_arrays_are_accepted(make_driver, model) -> None:
    d = make_driver(model)
    array = np.arange(6, dtype=np.int32).reshape(2, 3)
    assert d.tensor_buffer(array)[:2] == ("I32", (2, 3))
    assert torch.equal(d.tensors_from_bytes(writer.encode(d.tensor_file({"a": array})))["a"], torch.from_numpy(array))


@pytest.mark.gpu
def test_gpu_tensors_are_copied_to_the_cpu_bit_exactly(make_driver, model) -> None:
    d = make_driver(model)
    tensors = {k: v.to("cuda") for k, v in every_dtype().items() if not k.startswith("float8")}
    loaded = d.tensors_from_bytes(writer.encode(d.tensor_file(tensors)))
    assert_bit_equal(loaded, {k: v.cpu() for k, v in tensors.items()})


def test_writer_chunks_large_tensors(make_driver, model, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(writer, "CHUNK", 1000)
    monkeypatch.setattr(writer, "_THREAD_MIN", 0)
    d = make_driver(model)
    tensors = {"big": random_tensor(torch.bfloat16, (3000,), seed=9), "small": random_tensor(torch.bool, (7,))}
    sha256, size = writer.write_file(str(tmp_path / "c.safetensors"), d.tensor_file(tensors))
    data = (tmp_path / "c.safetensors").read_bytes()
    assert sha256 == hashlib.sha256(data).hexdigest() and size == len(data)
    assert_bit_equal(safetensors.torch.load(data), tensors)
