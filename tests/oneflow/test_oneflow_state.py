"""State through the oneflow driver: tensor files (safetensors, no pickle), model/gradient/optimizer/RNG
states, and checkpoints that resume bit-exactly."""

from __future__ import annotations

import json
import os
import struct

import numpy as np
import pytest

from drivetrain import Event, LRSchedulerCallback, Trainer, seed_everything
from drivetrain._common.errors import DriverError
from drivetrain._format import safetensors_writer
from drivetrain._format.codec import join_state, split_state

from .conftest import flow, tiny_net

pytestmark = pytest.mark.oneflow

DTYPES = ["float32", "float64", "float16", "bfloat16", "int8", "uint8", "int32", "int64", "bool"]


def _bits(tensor) -> bytes:
    if tensor.dtype == flow.bfloat16:  # numpy() widens bf16 to float32 exactly: compare those bits
        tensor = tensor.to(flow.float32)
    return np.ascontiguousarray(tensor.numpy()).tobytes()


def _train(driver, batch) -> None:
    fn, sig = driver.get_model_call_fn(None)
    driver.backward(driver.model_call(batch, fn, sig)["loss"])


# ------------------------------------------------------------------------ tensor files
def test_every_dtype_round_trips_bit_exactly(model, make_driver) -> None:
    d = make_driver(model)
    rng = np.random.default_rng(0)
    tensors = {dtype: flow.tensor(rng.standard_normal((3, 5)).astype(np.float32) * 4).to(getattr(flow, dtype))
               for dtype in DTYPES}
    tensors["scalar"] = flow.tensor(np.float32(2.5))
    tensors["empty"] = flow.zeros(0, 3)
    tensors["strided"] = flow.arange(12, dtype=flow.float32).reshape(3, 4)[:, 1]
    tensors["numpy"] = np.arange(6, dtype=np.int32).reshape(2, 3)
    back = d.tensors_from_bytes(safetensors_writer.encode(d.tensor_file(tensors)))
    assert set(back) == set(tensors)
    for name, original in tensors.items():
        if isinstance(original, np.ndarray):
            original = flow.tensor(original)
        got = back[name]
        assert got.dtype == original.dtype, name
        assert tuple(got.shape) == tuple(original.shape), name
        assert _bits(got) == _bits(original), name
        assert got.device.type == "cpu"


def test_tensor_buffer_gives_the_raw_bytes_of_each_dtype(model, make_driver) -> None:
    d = make_driver(model)
    dtype, shape, data = d.tensor_buffer(model.fc1.weight)
    assert (dtype, shape, data.nbytes) == ("F32", (8, 4), 8 * 4 * 4)
    assert bytes(data) == model.fc1.weight.numpy().tobytes()
    dtype, shape, data = d.tensor_buffer(flow.tensor([1.0, -2.0]).to(flow.bfloat16))
    assert (dtype, shape, bytes(data)) == ("BF16", (2,), b"\x80\x3f\x00\xc0")
    with pytest.raises(DriverError, match="^is a str, not a oneflow tensor"):
        d.tensor_buffer("w")


def test_tensor_files_are_standard_safetensors(model, make_driver, tmp_path) -> None:
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    d = make_driver(model)
    path = str(tmp_path / "t.safetensors")
    d.save_tensors({"w": model.fc1.weight, "steps": flow.tensor([3], dtype=flow.int64)}, path)
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    assert header["w"]["dtype"] == "F32" and header["steps"]["dtype"] == "I64"
    plain = safetensors_numpy.load_file(path)  # any safetensors reader, no oneflow involved
    np.testing.assert_array_equal(plain["w"], model.fc1.weight.numpy())
    back = d.load_tensors(path)
    np.testing.assert_array_equal(back["w"].numpy(), model.fc1.weight.numpy())


def test_bad_tensor_inputs_name_the_entry(model, make_driver, tmp_path) -> None:
    d = make_driver(model)
    with pytest.raises(DriverError, match=r"save_tensors: 'bad' is a list, not a oneflow tensor"):
        d.tensor_file({"bad": [1, 2]})
    broken = tmp_path / "broken.safetensors"
    broken.write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00{nope")
    with pytest.raises(DriverError, match="not a readable safetensors file"):
        d.load_tensors(str(broken))
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    other = str(tmp_path / "u16.safetensors")
    safetensors_numpy.save_file({"u": np.zeros(2, np.uint16)}, other)
    with pytest.raises(DriverError, match="has dtype U16, which oneflow 0.9 has no dtype for"):
        d.load_tensors(other)


# ------------------------------------------------------------------------- model state
def test_model_state_loads_back_into_a_fresh_model_keeping_parameter_identity(model, make_driver) -> None:
    d = make_driver(model)
    state = {k: v.numpy().copy() for k, v in d.model_state().items()}
    other = tiny_net(seed=5)
    weight = other.fc1.weight
    od = make_driver(other)
    od.load_model_state(d.tensors_from_bytes(safetensors_writer.encode(d.tensor_file(d.model_state()))))
    assert other.fc1.weight is weight  # copied into the existing parameter: optimizers stay valid
    for name, value in od.model_state().items():
        np.testing.assert_array_equal(value.numpy(), state[name])
    od.load_model_state({k: v * 0 for k, v in state.items()})  # numpy arrays are accepted too
    assert float(other.fc2.bias.abs().sum().numpy()) == 0.0


def test_load_model_state_errors(model, make_driver) -> None:
    d = make_driver(model)
    state = d.model_state()
    with pytest.raises(DriverError, match=r"missing key\(s\) \['fc2.bias'\]"):
        d.load_model_state({k: v for k, v in state.items() if k != "fc2.bias"})
    with pytest.raises(DriverError, match=r"unexpected key\(s\) \['extra'\]"):
        d.load_model_state(dict(state, extra=flow.zeros(1)))
    with pytest.raises(DriverError, match=r"state\['fc1.weight'\] has shape \(2, 2\)"):
        d.load_model_state(dict(state, **{"fc1.weight": flow.zeros(2, 2)}))
    with pytest.raises(DriverError, match=r"state\['fc1.bias'\] is a str"):
        d.load_model_state(dict(state, **{"fc1.bias": "zeros"}))
    with pytest.raises(DriverError, match="needs a dict of name -> tensor"):
        d.load_model_state([1, 2])


# --------------------------------------------------------------------------- gradients
def test_gradients_round_trip_and_accumulate_exactly(make_driver, batches) -> None:
    reference = tiny_net()
    rd = make_driver(reference)
    rd.set_optimizers(flow.optim.SGD(reference.parameters(), lr=0.1))
    _train(rd, batches[0])
    saved = rd.tensors_from_bytes(safetensors_writer.encode(rd.tensor_file(rd.gradient_state())))
    _train(rd, batches[1])
    expected = {k: v.numpy().copy() for k, v in rd.gradient_state().items()}

    resumed = tiny_net()
    d = make_driver(resumed)
    d.set_optimizers(flow.optim.SGD(resumed.parameters(), lr=0.1))
    d.load_gradient_state(saved)
    _train(d, batches[1])
    for name, value in d.gradient_state().items():
        np.testing.assert_array_equal(value.numpy(), expected[name])
    d.load_gradient_state({})
    assert all(p.grad is None for p in resumed.parameters())
    with pytest.raises(DriverError, match=r"has no parameter\(s\) \['ghost'\]"):
        d.load_gradient_state({"ghost": flow.zeros(1)})
    with pytest.raises(DriverError, match=r"grads\['fc1.bias'\] has shape \(3,\)"):
        d.load_gradient_state({"fc1.bias": flow.zeros(3)})


# -------------------------------------------------------------------------------- RNG
def _through_a_checkpoint_file(driver, state):
    """``state`` the way a checkpoint stores it: JSON skeleton plus a safetensors file for the tensors."""
    skeleton, tensors = split_state(state, driver.is_tensor, "rng")
    data = safetensors_writer.encode(driver.tensor_file(tensors))
    return join_state(json.loads(json.dumps(skeleton)), driver.tensors_from_bytes(data))


def _noisy_net():
    return flow.nn.Sequential(flow.nn.Linear(4, 64), flow.nn.Dropout(0.5), flow.nn.Dropout(0.2))


@pytest.mark.parametrize("draws_before", [0, 1, 5, 623, 624, 700, 1300])
def test_rng_state_restores_global_and_dropout_draws_exactly(make_driver, draws_before) -> None:
    net = _noisy_net()
    d = make_driver(net)
    d.seed(3)
    x = flow.ones(2, 4)
    if draws_before:
        flow.rand(draws_before)
        net(x)
    state = _through_a_checkpoint_file(d, d.rng_state())
    first = (flow.rand(3).numpy(), net(x).numpy(), flow.rand(2000).numpy())
    d.load_rng_state(state)
    again = (flow.rand(3).numpy(), net(x).numpy(), flow.rand(2000).numpy())
    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(a, b)  # the global generator and both Dropouts' own came back
    assert set(state["modules"]) == {"1", "2"}


def test_taking_an_rng_state_changes_no_draw(make_driver) -> None:
    """A run that saves checkpoints (or evaluates) must draw what a run that does not draws."""
    outputs = []
    for capture in (False, True):
        flow.manual_seed(0)  # the same Linear weights both times
        net = _noisy_net()
        d = make_driver(net)
        d.seed(11)
        x = flow.ones(3, 4)
        drawn = [net(x).numpy(), flow.rand(100).numpy()]
        if capture:
            d.rng_state()
        drawn += [net(x).numpy(), flow.rand(100).numpy()]
        outputs.append(drawn)
    for a, b in zip(*outputs, strict=True):
        np.testing.assert_array_equal(a, b)


def test_seed_reaches_the_generators_oneflow_manual_seed_does_not(make_driver) -> None:
    a = _noisy_net()
    da = make_driver(a)
    x = flow.ones(1, 4)
    da.seed(1)
    one = a(x).numpy()
    da.seed(2)
    two = a(x).numpy()
    da.seed(1)
    np.testing.assert_array_equal(a(x).numpy(), one)
    assert not np.array_equal(one, two)


def test_bad_rng_states_are_refused(make_driver) -> None:
    d = make_driver(_noisy_net())
    good = d.rng_state()
    with pytest.raises(DriverError, match="with a 'cpu' entry"):
        d.load_rng_state({})
    with pytest.raises(DriverError, match=r"unknown entr\(ies\) \['mps'\]"):
        d.load_rng_state(dict(good, mps=2))
    with pytest.raises(DriverError, match=r"state\['cpu'\] is a Tensor, not a captured generator"):
        d.load_rng_state({"cpu": flow.get_rng_state()})  # a torch-style byte state from another driver
    with pytest.raises(DriverError, match=r"lacks words/position/seed"):
        d.load_rng_state({"cpu": {"seed": 1}})
    with pytest.raises(DriverError, match=r"has 3 words and position 0"):
        d.load_rng_state({"cpu": {"words": np.zeros(3, np.int64), "position": 0, "seed": 1}})
    with pytest.raises(DriverError, match=r"generators of module\(s\) \['9'\]"):
        d.load_rng_state(dict(good, modules={"9": good["cpu"]}))


# ------------------------------------------------------------------------- optimizers
def test_optimizer_state_round_trips_into_a_fresh_optimizer(make_driver, batches) -> None:
    def build():
        net = tiny_net()
        d = make_driver(net)
        d.set_optimizers(flow.optim.Adam(net.parameters(), lr=0.05))
        return net, d

    net, d = build()
    for batch in batches[:2]:
        _train(d, batch)
        d.step()
        d.zero_grad()
    states = d.optimizer_states()
    params = d.model_state()
    net2, d2 = build()
    d2.load_model_state(params)
    d2.load_optimizer_states(states)
    for driver in (d, d2):
        _train(driver, batches[2])
        driver.step()
    for a, b in zip(net.parameters(), net2.parameters(), strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    with pytest.raises(DriverError, match="holds 2 optimizer state"):
        d2.load_optimizer_states(states * 2)
    with pytest.raises(DriverError, match="without 'state' and 'param_groups'"):
        d2.load_optimizer_states([{"lr": 1}])


# ----------------------------------------------------------------- checkpoints, resume
class Noisy(flow.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = flow.nn.Linear(4, 16)
        self.bn = flow.nn.BatchNorm1d(16)
        self.drop = flow.nn.Dropout(0.3)
        self.fc2 = flow.nn.Linear(16, 3)

    def forward(self, x, target):
        pred = self.fc2(self.drop(flow.relu(self.bn(self.fc1(x)))))
        return {"loss": flow.nn.functional.cross_entropy(pred, target), "pred": pred}


class Table(flow.utils.data.Dataset):
    def __init__(self, n: int = 100) -> None:
        rng = np.random.default_rng(0)
        self.x = rng.standard_normal((n, 4)).astype(np.float32)
        self.t = rng.integers(0, 3, n)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict:
        return {"x": self.x[i], "target": self.t[i]}


def _build_run():
    seed_everything(0)
    model = Noisy()
    opt = flow.optim.AdamW(model.parameters(), lr=0.05)
    scheduler = flow.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.5)
    loader = flow.utils.data.DataLoader(Table(), batch_size=8, shuffle=True)
    trainer = Trainer(model, loader, opt, driver="oneflow", n_epochs=3, accumulation_steps=3, progress_bar=None,
                      callbacks=[LRSchedulerCallback(scheduler)])
    return trainer, model


def _final(model) -> dict[str, np.ndarray]:
    return {k: v.numpy().copy() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("stop_at", [5, 13, 17, 26])  # mid-cycle, epoch edge (13 batches/epoch), later
def test_stop_anywhere_rebuild_and_resume_is_bit_exact(tmp_path, stop_at) -> None:
    trainer, model = _build_run()
    trainer.run(num_eval_sanity_batch=0)
    reference = _final(model)

    trainer, model = _build_run()
    folder = tmp_path / "ck"
    trainer.add_callback_fn(Event.on_train_batch_end(), lambda t: t.save_checkpoint(folder)
                            if t.global_forward_batches == stop_at else None)
    trainer.run(num_eval_sanity_batch=0)

    resumed, rebuilt = _build_run()
    resumed.run(resume_from=folder, num_eval_sanity_batch=0)
    assert resumed.global_forward_batches == 39
    final = _final(rebuilt)
    for key, value in reference.items():
        assert final[key].tobytes() == value.tobytes(), f"{key} differs from the uninterrupted run"


def test_checkpoints_never_go_through_oneflow_save_or_load(tmp_path, monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("oneflow.save/oneflow.load (a directory format with pickle) must not be used")

    monkeypatch.setattr(flow, "save", refuse)
    monkeypatch.setattr(flow, "load", refuse)
    trainer, _ = _build_run()
    trainer.run(num_eval_sanity_batch=0, num_train_batch_per_epoch=2)
    trainer.save_checkpoint(tmp_path / "ck")
    trainer.save_model(tmp_path / "model")
    again, _ = _build_run()
    again.load_checkpoint(tmp_path / "ck")
    again.load_model(tmp_path / "model")
    manifest = json.loads((tmp_path / "ck" / "manifest.json").read_text())
    assert manifest["driver"] == "oneflow" and manifest["pickle"] is False
    assert manifest["framework_version"] == flow.__version__
    assert not any(name.endswith((".pkl", ".pickle")) for name in os.listdir(tmp_path / "ck"))
