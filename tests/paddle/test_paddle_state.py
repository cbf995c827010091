"""State through the paddle driver: tensor files, model/gradient/optimizer/RNG/precision states, and
checkpoints that survive rebuilding the model in the same process (new global parameter names)."""

from __future__ import annotations

import json
import os
import struct

import numpy as np
import pytest

from drivetrain import CheckpointError, Event, LRSchedulerCallback, Trainer, seed_everything
from drivetrain._common.errors import DriverError
from drivetrain._format import safetensors_writer

from .conftest import TinyNet, paddle

pytestmark = pytest.mark.filterwarnings("ignore:When training, we now always track global mean")  # BatchNorm1D

DTYPES = ["float32", "float64", "float16", "bfloat16", "int8", "uint8", "int16", "int32", "int64", "bool",
          "complex64", "float8_e4m3fn", "float8_e5m2"]


def _bits(tensor) -> bytes:
    return np.ascontiguousarray(tensor.numpy()).tobytes()


# ------------------------------------------------------------------------ tensor files
def test_every_dtype_round_trips_bit_exactly(model, make_driver) -> None:
    d = make_driver(model)
    rng = np.random.default_rng(0)
    tensors = {}
    for dtype in DTYPES:
        base = paddle.to_tensor(rng.standard_normal((3, 5)).astype(np.float32) * 4)
        tensors[dtype] = base.astype(dtype)
    tensors["scalar"] = paddle.to_tensor(np.float32(2.5))
    tensors["empty"] = paddle.zeros([0, 3])
    tensors["numpy"] = np.arange(6, dtype=np.int32).reshape(2, 3)
    back = d.tensors_from_bytes(safetensors_writer.encode(d.tensor_file(tensors)))
    assert set(back) == set(tensors)
    for name, original in tensors.items():
        if isinstance(original, np.ndarray):
            original = paddle.to_tensor(original)
        got = back[name]
        assert got.dtype == original.dtype, name
        assert list(got.shape) == list(original.shape), name
        assert _bits(got) == _bits(original), name
        assert got.place.is_cpu_place()


def test_tensor_buffer_hands_over_cpu_memory_without_a_copy(model, make_driver) -> None:
    d = make_driver(model)
    dtype, shape, data = d.tensor_buffer(model.fc1.weight)
    assert (dtype, shape, data.nbytes) == ("F32", (4, 8), 4 * 8 * 4)
    model.fc1.weight.set_value(paddle.full([4, 8], 2.0))
    assert np.frombuffer(data, np.float32).tolist() == [2.0] * 32  # a view of the parameter itself
    dtype, shape, data = d.tensor_buffer(paddle.to_tensor([1.0, -2.0]).astype("bfloat16"))
    assert (dtype, shape, bytes(data)) == ("BF16", (2,), b"\x80\x3f\x00\xc0")
    with pytest.raises(DriverError, match="^is a str, not a paddle tensor"):
        d.tensor_buffer("w")


def test_tensor_files_are_standard_safetensors(model, make_driver, tmp_path) -> None:
    d = make_driver(model)
    path = str(tmp_path / "t.safetensors")
    d.save_tensors({"b": paddle.ones([2], dtype="bfloat16"), "w": paddle.ones([2, 3])}, path)
    raw = open(path, "rb").read()
    (size,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + size])
    assert header["b"]["dtype"] == "BF16" and header["w"] == {"dtype": "F32", "shape": [2, 3],
                                                             "data_offsets": [0, 24]}
    from safetensors import safe_open  # any safetensors reader opens it (numpy: all but the bf16 entry)

    with safe_open(path, framework="np") as f:
        assert f.get_tensor("w").tolist() == [[1.0] * 3] * 2


def test_bad_tensor_inputs_name_the_entry(model, make_driver, tmp_path) -> None:
    d = make_driver(model)
    with pytest.raises(DriverError, match=r"save_tensors: 'lr' is a float, not a paddle tensor"):
        d.tensor_file({"lr": 0.1})
    with pytest.raises(DriverError, match="tensor names must be str"):
        d.tensor_file({1: paddle.ones([1])})
    with pytest.raises(DriverError, match="complex128.*safetensors cannot store"):
        d.tensor_file({"c": paddle.zeros([1], dtype="complex128")})
    path = tmp_path / "broken.safetensors"
    path.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json")
    with pytest.raises(DriverError, match="not a readable safetensors file"):
        d.load_tensors(str(path))


# ------------------------------------------------------------------------------ model
def test_model_state_uses_structured_names_and_loads_back(model, make_driver) -> None:
    d = make_driver(model)
    state = d.model_state()
    assert sorted(state) == ["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"]
    saved = {k: v.numpy().copy() for k, v in state.items()}
    params = [id(p) for p in model.parameters()]
    for p in model.parameters():
        p.set_value(paddle.zeros_like(p))
    d.load_model_state({k: v for k, v in saved.items()})  # numpy arrays are accepted too
    assert [id(p) for p in model.parameters()] == params
    for k, v in d.model_state().items():
        np.testing.assert_array_equal(v.numpy(), saved[k])


def test_load_model_state_errors(model, make_driver) -> None:
    d = make_driver(model)
    state = d.model_state()
    with pytest.raises(DriverError, match=r"missing key\(s\) \['fc2.bias'\]; unexpected key\(s\) \['extra'\]"):
        d.load_model_state({**{k: v for k, v in state.items() if k != "fc2.bias"}, "extra": state["fc1.bias"]})
    with pytest.raises(DriverError, match=r"state\['fc1.weight'\] has shape \[2, 2\] but the model's"):
        d.load_model_state({**state, "fc1.weight": paddle.zeros([2, 2])})
    with pytest.raises(DriverError, match=r"state\['fc1.bias'\] is a list"):
        d.load_model_state({**state, "fc1.bias": [0.0] * 8})


# -------------------------------------------------------------------------- gradients
def test_gradients_round_trip_and_accumulate_exactly(make_driver, batches) -> None:
    paddle.seed(0)
    model = TinyNet()
    d = make_driver(model)
    fn, sig = d.get_model_call_fn(None)
    d.backward(d.model_call(batches[0], fn, sig)["loss"])
    grads = d.tensors_from_bytes(safetensors_writer.encode(d.tensor_file(d.gradient_state())))
    d.backward(d.model_call(batches[1], fn, sig)["loss"])
    expected = {n: p.grad.numpy().copy() for n, p in model.named_parameters()}

    paddle.seed(0)
    fresh = TinyNet()
    d2 = make_driver(fresh)
    d2.load_model_state(d.model_state())
    d2.load_gradient_state(grads)
    d2.backward(d2.model_call(batches[1], *d2.get_model_call_fn(None))["loss"])
    for name, param in fresh.named_parameters():
        assert _bits(param.grad) == expected[name].tobytes(), name


def test_gradient_state_lists_only_existing_gradients_and_clears_the_others(model, make_driver, batches) -> None:
    d = make_driver(model)
    assert d.gradient_state() == {}
    model.fc1.weight.grad = paddle.ones_like(model.fc1.weight)
    model.fc2.bias.grad = paddle.ones_like(model.fc2.bias)
    assert sorted(d.gradient_state()) == ["fc1.weight", "fc2.bias"]
    d.load_gradient_state({"fc1.bias": np.ones(8, np.float32)})
    assert model.fc1.weight.grad is None and model.fc2.bias.grad is None
    assert model.fc1.bias.grad.numpy().tolist() == [1.0] * 8
    with pytest.raises(DriverError, match=r"has no parameter\(s\) \['nope'\]"):
        d.load_gradient_state({"nope": paddle.ones([1])})
    with pytest.raises(DriverError, match=r"grads\['fc1.bias'\] has shape \[3\]"):
        d.load_gradient_state({"fc1.bias": paddle.ones([3])})


# ---------------------------------------------------------------------------------- RNG
def test_rng_state_restores_dropout_draws_through_bytes(model, make_driver) -> None:
    d = make_driver(model)
    paddle.seed(7)
    paddle.rand([5])
    state = d.rng_state()
    tensors = {f"e{i}": s["engine"] for i, s in enumerate(state["cpu"])}
    back = d.tensors_from_bytes(safetensors_writer.encode(d.tensor_file(tensors)))
    restored = {"cpu": [{**s, "engine": back[f"e{i}"]} for i, s in enumerate(state["cpu"])]}
    json.dumps({k: [{kk: vv for kk, vv in s.items() if kk != "engine"} for s in v] for k, v in restored.items()})
    drop = paddle.nn.Dropout(0.5)
    first = drop(paddle.ones([64])).numpy()
    paddle.rand([100])  # move the generator on
    d.load_rng_state(restored)
    np.testing.assert_array_equal(drop(paddle.ones([64])).numpy(), first)
    assert "gpu" not in state  # a CPU run does not touch GPU generators


def test_bad_rng_states_are_refused(model, make_driver) -> None:
    d = make_driver(model)
    with pytest.raises(DriverError, match="with a 'cpu' entry"):
        d.load_rng_state({"cuda": []})
    with pytest.raises(DriverError, match="unknown entr"):
        d.load_rng_state({"cpu": [], "xpu": []})
    with pytest.raises(DriverError, match="not a paddle generator state"):
        d.load_rng_state({"cpu": [{"seed": 1}]})


# ---------------------------------------------------------------------------- optimizers
OPTIMIZERS = {
    "SGD": lambda params, lr: paddle.optimizer.SGD(learning_rate=lr, parameters=params),
    "Momentum": lambda params, lr: paddle.optimizer.Momentum(learning_rate=lr, momentum=0.9, parameters=params),
    "Adam": lambda params, lr: paddle.optimizer.Adam(learning_rate=lr, parameters=params),
    "AdamW": lambda params, lr: paddle.optimizer.AdamW(learning_rate=lr, parameters=params, weight_decay=0.1),
    "Adagrad": lambda params, lr: paddle.optimizer.Adagrad(learning_rate=lr, parameters=params),
    "RMSProp": lambda params, lr: paddle.optimizer.RMSProp(learning_rate=lr, parameters=params),
    "Lamb": lambda params, lr: paddle.optimizer.Lamb(learning_rate=lr, parameters=params),
    "named Adam": lambda params, lr: paddle.optimizer.Adam(learning_rate=lr, parameters=params, name="enc"),
}


def _steps(driver, batches) -> None:
    fn, sig = driver.get_model_call_fn(None)
    for batch in batches:
        driver.backward(driver.model_call(batch, fn, sig)["loss"])
        driver.step()
        driver.zero_grad()


def _through_checkpoint_codec(driver, value):
    """What a checkpoint does to a nested state: tensors to safetensors bytes, the rest to JSON."""
    from drivetrain._format.codec import join_state, split_state

    skeleton, tensors = split_state(value, driver.is_tensor, "s")
    data = safetensors_writer.encode(driver.tensor_file(tensors))
    return join_state(json.loads(json.dumps(skeleton)), driver.tensors_from_bytes(data))


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_optimizer_state_loads_into_a_model_rebuilt_in_the_same_process(make_driver, batches, name) -> None:
    make = OPTIMIZERS[name]
    paddle.seed(0)
    model = TinyNet()
    d = make_driver(model)
    d.set_optimizers(make(model.parameters(), 0.05))
    _steps(d, batches[:3])
    states = _through_checkpoint_codec(d, d.optimizer_states())
    text = json.dumps(_through_checkpoint_codec(d, states), default=lambda t: list(t.shape))
    assert "linear_" not in text and ".w_0" not in text, "paddle's global names leaked into the state"
    weights = {k: v.clone() for k, v in d.model_state().items()}  # model_state shares memory
    _steps(d, batches[3:6])
    expected = {k: v.numpy().copy() for k, v in d.model_state().items()}

    rebuilt = TinyNet()  # same process: parameters get new global names
    assert rebuilt.fc1.weight.name != model.fc1.weight.name
    d2 = make_driver(rebuilt)
    d2.set_optimizers(make(rebuilt.parameters(), 0.05))
    d2.load_model_state(weights)
    d2.load_optimizer_states(states)
    _steps(d2, batches[3:6])
    for key, value in d2.model_state().items():
        assert _bits(value) == expected[key].tobytes(), f"{name}: {key} differs after resuming"


def test_optimizer_state_can_be_loaded_into_a_stepped_optimizer(model, make_driver, batches) -> None:
    d = make_driver(model)
    d.set_optimizers(OPTIMIZERS["Adam"](model.parameters(), 0.05))
    _steps(d, batches[:2])
    states = _through_checkpoint_codec(d, d.optimizer_states())  # a copy: the states are live views
    saved = {k: v.numpy().copy() for k, v in states[0]["accumulators"]["moment1"].items()}
    _steps(d, batches[2:4])
    d.load_optimizer_states(states)
    for k, v in d.optimizer_states()[0]["accumulators"]["moment1"].items():
        np.testing.assert_array_equal(v.numpy(), saved[k])


def test_learning_rate_and_scheduler_travel_with_the_optimizer(model, make_driver) -> None:
    d = make_driver(model)
    opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
    d.set_optimizers(opt)
    opt.set_lr(0.03)
    states = d.optimizer_states()
    opt.set_lr(0.5)
    d.load_optimizer_states(states)
    assert opt.get_lr() == pytest.approx(0.03)
    scheduler = paddle.optimizer.lr.StepDecay(learning_rate=0.1, step_size=1, gamma=0.5)
    opt2 = paddle.optimizer.SGD(learning_rate=scheduler, parameters=model.parameters())
    d.set_optimizers(opt2)
    scheduler.step()
    states = d.optimizer_states()
    scheduler.step()
    d.load_optimizer_states(states)
    assert opt2.get_lr() == pytest.approx(0.05)


def test_optimizer_state_errors(model, make_driver, tiny_net_cls, batches) -> None:
    d = make_driver(model)
    d.set_optimizers(OPTIMIZERS["Adam"](model.parameters(), 0.05))
    _steps(d, batches[:1])
    states = d.optimizer_states()
    with pytest.raises(DriverError, match=r"holds 1 optimizer state\(s\) but the trainer has 2"):
        d2 = make_driver(model)
        d2.set_optimizers([OPTIMIZERS["SGD"](model.parameters(), 0.1), OPTIMIZERS["SGD"](model.parameters(), 0.1)])
        d2.load_optimizer_states(states)
    torch_like = {"state": {0: {}}, "param_groups": [{"params": [0], "lr": 0.1}]}
    with pytest.raises(DriverError, match=r"optimizer_states\[0\] is a dict without 'accumulators'.*another driver"):
        d.load_optimizer_states([torch_like])
    bigger = paddle.nn.Sequential(paddle.nn.Linear(4, 8))
    d3 = make_driver(bigger)
    d3.set_optimizers(OPTIMIZERS["Adam"](bigger.parameters(), 0.05))
    with pytest.raises(DriverError, match=r"holds state for parameter\(s\) \['fc1.bias'.*does not have"):
        d3.load_optimizer_states(states)


def test_precision_state_on_cpu(model, make_driver) -> None:
    d = make_driver(model)
    assert d.precision_state() is None
    d.load_precision_state(None)
    with pytest.warns(UserWarning, match="holds a grad scaler state .* the state is ignored"):
        d.load_precision_state({"scale": np.array([1024.0], np.float32), "incr_count": 0, "decr_count": 0})
    with pytest.raises(DriverError, match="needs the dict returned by precision_state"):
        d.load_precision_state([1])


# ---------------------------------------------------------------------------- checkpoints
class Noisy(paddle.nn.Layer):
    """Dropout, batch norm (its running statistics are parameters in paddle) and two layers."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = paddle.nn.Linear(4, 16)
        self.bn = paddle.nn.BatchNorm1D(16)
        self.drop = paddle.nn.Dropout(0.3)
        self.fc2 = paddle.nn.Linear(16, 3)

    def forward(self, x, target):
        pred = self.fc2(self.drop(paddle.nn.functional.relu(self.bn(self.fc1(x)))))
        return {"loss": paddle.nn.functional.cross_entropy(pred, target), "pred": pred}


class Table(paddle.io.Dataset):
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
    scheduler = paddle.optimizer.lr.StepDecay(0.05, step_size=5, gamma=0.5)
    opt = paddle.optimizer.AdamW(learning_rate=scheduler, parameters=model.parameters())
    loader = paddle.io.DataLoader(Table(), batch_size=8, shuffle=True)
    trainer = Trainer(model, loader, opt, driver="paddle", n_epochs=3, accumulation_steps=3, progress_bar=None,
                      callbacks=[LRSchedulerCallback(scheduler)])
    return trainer, model


def _final(model) -> dict[str, np.ndarray]:
    return {k: v.numpy().copy() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("stop_at", [5, 13, 17, 26])  # mid-cycle, epoch edge (13 batches/epoch), later
def test_rebuild_in_the_same_process_and_resume_is_bit_exact(tmp_path, stop_at) -> None:
    trainer, model = _build_run()
    trainer.run(num_eval_sanity_batch=0)
    reference = _final(model)

    trainer, model = _build_run()
    folder = tmp_path / "ck"
    trainer.add_callback_fn(Event.on_train_batch_end(), lambda t: t.save_checkpoint(folder)
                            if t.global_forward_batches == stop_at else None)
    trainer.run(num_eval_sanity_batch=0)
    assert not any(name.endswith(".pkl") for name in os.listdir(folder))
    state_json = (folder / "training_state.json").read_text()
    assert "linear_" not in state_json and "batch_norm" not in state_json

    resumed, rebuilt = _build_run()
    assert rebuilt.fc1.weight.name != model.fc1.weight.name  # paddle's global names moved on
    resumed.run(resume_from=folder, num_eval_sanity_batch=0)
    assert resumed.global_forward_batches == 39
    final = _final(rebuilt)
    for key, value in reference.items():
        assert final[key].tobytes() == value.tobytes(), f"{key} differs from the uninterrupted run"


def test_checkpoints_never_go_through_paddle_save_or_load(tmp_path, monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("paddle.save/paddle.load (pickle) must not be used for checkpoints")

    monkeypatch.setattr(paddle, "save", refuse)
    monkeypatch.setattr(paddle, "load", refuse)
    trainer, _ = _build_run()
    trainer.run(num_eval_sanity_batch=0, num_train_batch_per_epoch=2)
    trainer.save_checkpoint(tmp_path / "ck")
    trainer.save_model(tmp_path / "model")
    again, _ = _build_run()
    again.load_checkpoint(tmp_path / "ck")
    again.load_model(tmp_path / "model")
    manifest = json.loads((tmp_path / "ck" / "manifest.json").read_text())
    assert manifest["driver"] == "paddle" and manifest["pickle"] is False
    assert manifest["framework_version"] == paddle.__version__


def test_a_torch_checkpoint_is_refused_end_to_end(tmp_path) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("drivetrain_torch")
    net = torch.nn.Linear(4, 2)
    batch = [{"input": torch.zeros(2, 4)}]
    source = Trainer(net, batch, torch.optim.SGD(net.parameters(), lr=0.1), driver="torch", progress_bar=None)
    source.save_checkpoint(tmp_path / "torch-ck")
    source.save_model(tmp_path / "torch-model")

    model = TinyNet()
    trainer = Trainer(model, [{"x": paddle.zeros([2, 4])}], paddle.optimizer.SGD(parameters=model.parameters()),
                      driver="paddle", progress_bar=None)
    with pytest.raises(CheckpointError, match=r"written by driver 'torch' but this trainer uses 'paddle'\. A "
                       r"training checkpoint resumes only in the framework that wrote it"):
        trainer.load_checkpoint(tmp_path / "torch-ck")
    with pytest.raises(CheckpointError, match=r"written by driver 'torch'"):
        trainer.run(resume_from=tmp_path / "torch-ck")
    # weights do cross frameworks, into the same architecture (tests/paddle/test_cross_framework.py); not this one
    with pytest.raises(CheckpointError, match=r"written by driver 'torch'\) does not fit this paddle model"):
        trainer.load_model(tmp_path / "torch-model")
