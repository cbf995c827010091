"""The torch driver's parts of sample-exact resume: tensor bytes, gradients, RNG, grad scaler,
optimizer states, and reproducible DataLoaders.

The last test puts the parts together the way a checkpoint does -- everything
through bytes and JSON, a fresh model, optimizer, driver and DataLoader -- and
checks a run resumed mid-accumulation-cycle ends bit-identical to an
uninterrupted one.
"""

from __future__ import annotations

import json
import random
import warnings
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, RandomSampler, TensorDataset, WeightedRandomSampler

from drivetrain._common.errors import DriverError
from drivetrain._data.sampler import ReproducibleBatchSampler, find_reproducible_sampler
from drivetrain._format import safetensors_writer

# ----------------------------------------------------------------------------- helpers


class DropoutNet(torch.nn.Module):
    """A classifier with dropout, so the global torch RNG matters to training."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 16)
        self.drop = torch.nn.Dropout(0.5)
        self.fc2 = torch.nn.Linear(16, 2)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> dict:
        logits = self.fc2(self.drop(torch.relu(self.fc1(x))))
        return {"loss": torch.nn.functional.cross_entropy(logits, y)}


class NumpyDataset(Dataset):
    """Map-style dataset backed by numpy arrays (module level, so worker processes can use it)."""

    def __init__(self, n: int = 20) -> None:
        rng = np.random.default_rng(0)
        self.x = rng.standard_normal((n, 4)).astype(np.float32)
        self.y = (self.x[:, 0] > 0).astype(np.int64)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict:
        return {"x": self.x[i], "y": self.y[i], "index": i}


def _index_dataset(n: int = 10) -> TensorDataset:
    return TensorDataset(torch.arange(n))


def _indices(loader) -> list[list[int]]:
    return [batch[0].tolist() for batch in loader]


def _repro(driver, loader):
    return driver.set_dist_repro_dataloader(loader, dist=None, reproducible=True)


def _split(obj: Any, tensors: dict, path: str = "t") -> Any:
    """Like a checkpoint: tensors go to a flat dict (then safetensors), the rest to JSON."""
    if isinstance(obj, torch.Tensor):
        tensors[path] = obj
        return {"__tensor__": path}
    if isinstance(obj, dict):
        return {"__dict__": [[_split(k, tensors, f"{path}.k{i}"), _split(v, tensors, f"{path}.{i}")]
                             for i, (k, v) in enumerate(obj.items())]}
    if isinstance(obj, (list, tuple)):
        return [_split(v, tensors, f"{path}.{i}") for i, v in enumerate(obj)]
    return obj


def _join(obj: Any, tensors: dict) -> Any:
    if isinstance(obj, dict) and "__tensor__" in obj:
        return tensors[obj["__tensor__"]]
    if isinstance(obj, dict):
        return {_join(k, tensors): _join(v, tensors) for k, v in obj["__dict__"]}
    if isinstance(obj, list):
        return [_join(v, tensors) for v in obj]
    return obj


def _through_disk(driver, obj: Any) -> Any:
    """``obj`` after the trip a checkpoint makes: tensors through safetensors bytes, the rest through JSON."""
    tensors: dict = {}
    skeleton = json.loads(json.dumps(_split(obj, tensors)))
    return _join(skeleton, driver.tensors_from_bytes(safetensors_writer.encode(driver.tensor_file(tensors))))


def _params(model) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bytes of ``t``: compares NaN payloads and -0.0 too, which ``torch.equal`` would not."""
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8)


def _assert_identical(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(_bits(x), _bits(y))


def _step(driver, batch, fn_sig) -> None:
    with driver.auto_cast():
        out = driver.model_call(driver.move_data_to_device(batch), *fn_sig)
    driver.backward(out["loss"])


# ----------------------------------------------------------------------------- tensor bytes
def test_bytes_round_trip_every_dtype_bit_exactly(model, make_driver) -> None:
    d = make_driver(model)
    gen = torch.Generator().manual_seed(0)
    floats = torch.randn(5, 3, generator=gen)
    tensors = {
        "f32": floats,
        "f64": floats.double(),
        "f16": floats.half(),
        "bf16": torch.tensor([1.0, -0.0, float("inf"), float("nan"), 1e-40]).to(torch.bfloat16),
        "bf16_payload": torch.tensor([0x7FC1, 0x0001, -0x8000], dtype=torch.int16).view(torch.bfloat16),
        "i8": torch.tensor([-128, 127], dtype=torch.int8),
        "u8": torch.tensor([0, 255], dtype=torch.uint8),
        "i16": torch.tensor([-(2**15)], dtype=torch.int16),
        "i32": torch.tensor([2**31 - 1], dtype=torch.int32),
        "i64": torch.tensor([2**63 - 1, -(2**63)], dtype=torch.int64),
        "bool": torch.tensor([True, False]),
        "scalar": torch.tensor(3.5),
        "empty": torch.zeros(0, 4),
        "lone_view": torch.arange(10.0)[3:7],  # a view with a storage offset, nothing else shares it
        "t": floats.t(),  # non-contiguous
    }
    data = safetensors_writer.encode(d.tensor_file(tensors))
    assert isinstance(data, bytes) and not data.startswith(b"\x80")  # not pickle
    loaded = d.tensors_from_bytes(data)
    assert set(loaded) == set(tensors)
    for name, tensor in tensors.items():
        got = loaded[name]
        assert got.dtype == tensor.dtype and got.shape == tensor.shape and got.device.type == "cpu", name
        _assert_identical([got], [tensor])


def test_bytes_match_the_file_the_base_class_writes(model, make_driver, tmp_path) -> None:
    d = make_driver(model)
    state = d.model_state()
    d.save_tensors(state, tmp_path / "m.safetensors")
    assert (tmp_path / "m.safetensors").read_bytes() == safetensors_writer.encode(d.tensor_file(state))


def test_damaged_bytes_raise_a_driver_error_naming_the_file(model, make_driver, tmp_path) -> None:
    d = make_driver(model)
    path = tmp_path / "cut.safetensors"
    d.save_tensors(d.model_state(), path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(DriverError, match="cut.safetensors"):
        d.load_tensors(path)


def test_sparse_tensors_are_refused_with_the_fix(model, make_driver) -> None:
    d = make_driver(model)
    with pytest.raises(DriverError, match=r"'s' has layout .*to_dense"):
        d.tensor_file({"s": torch.eye(3).to_sparse()})


# ----------------------------------------------------------------------------- gradients
def test_gradient_state_round_trip_continues_accumulation_exactly(model, make_driver, tiny_net_cls, batches) -> None:
    d = make_driver(model)
    fn_sig = d.get_model_call_fn(None)
    _step(d, batches[0], fn_sig)
    grads = d.gradient_state()
    assert sorted(grads) == ["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"]
    assert all(g.device.type == "cpu" for g in grads.values())
    # copies: accumulating further into .grad does not change the saved state
    assert grads["fc1.weight"].untyped_storage().data_ptr() != model.fc1.weight.grad.untyped_storage().data_ptr()
    _step(d, batches[1], fn_sig)  # the uninterrupted run accumulates a second batch

    other = tiny_net_cls()
    d2 = make_driver(other)
    d2.load_model_state(d.model_state())
    d2.load_gradient_state(_through_disk(d2, grads))
    _step(d2, batches[1], d2.get_model_call_fn(None))
    for (name, p), q in zip(model.named_parameters(), other.parameters(), strict=True):
        assert torch.equal(p.grad, q.grad), name
        assert q.grad.dtype == q.dtype and q.grad.device == q.device


def test_gradient_state_skips_missing_grads_and_clears_absent_ones(model, make_driver, batches) -> None:
    d = make_driver(model)
    assert d.gradient_state() == {}  # nothing accumulated yet
    model.fc2.weight.grad = torch.ones_like(model.fc2.weight)
    assert list(d.gradient_state()) == ["fc2.weight"]
    model.fc1.bias.grad = torch.ones_like(model.fc1.bias)
    d.load_gradient_state({"fc2.weight": torch.full((2, 8), 2.0, dtype=torch.float64)})
    assert model.fc1.bias.grad is None  # absent from the state: no gradient
    assert model.fc2.weight.grad.dtype == torch.float32 and float(model.fc2.weight.grad[0, 0]) == 2.0


def test_load_gradient_state_errors_name_the_problem(model, make_driver) -> None:
    d = make_driver(model)
    with pytest.raises(DriverError, match=r"no parameter\(s\) \['fc9.weight'\]"):
        d.load_gradient_state({"fc9.weight": torch.zeros(1), "fc1.bias": torch.zeros(8)})
    with pytest.raises(DriverError, match=r"grads\['fc1.bias'\] has shape \(3,\) but the parameter has shape \(8,\)"):
        d.load_gradient_state({"fc1.bias": torch.zeros(3)})
    with pytest.raises(DriverError, match=r"grads\['fc1.bias'\] is a list"):
        d.load_gradient_state({"fc1.bias": [0.0] * 8})
    assert model.fc1.bias.grad is None  # a failed load changes nothing


def test_gradient_state_of_tied_weights_has_one_entry(make_driver) -> None:
    class Tied(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(5, 3)
            self.out = torch.nn.Linear(3, 5, bias=False)
            self.out.weight = self.embed.weight

    model = Tied()
    model.out(model.embed(torch.tensor([1, 2]))).sum().backward()
    d = make_driver(model)
    grads = d.gradient_state()
    assert list(grads) == ["embed.weight"]
    saved = grads["embed.weight"].clone()
    model.embed.weight.grad = None
    d.load_gradient_state(grads)
    assert torch.equal(model.out.weight.grad, saved)


# ----------------------------------------------------------------------------- RNG
def test_rng_state_round_trip_repeats_dropout_masks(make_driver) -> None:
    model = DropoutNet().train()
    d = make_driver(model)
    torch.manual_seed(5)
    state = d.rng_state()
    assert set(state) <= {"cpu", "cuda"} and state["cpu"].dtype == torch.uint8
    first = model.drop(torch.ones(1000))
    assert not torch.equal(first, model.drop(torch.ones(1000)))  # masks differ draw to draw
    d.load_rng_state(_through_disk(d, state))
    assert torch.equal(first, model.drop(torch.ones(1000)))


def test_rng_state_is_a_snapshot(make_driver, model) -> None:
    d = make_driver(model)
    state = d.rng_state()
    saved = state["cpu"].clone()
    torch.rand(10)
    assert torch.equal(state["cpu"], saved)


def test_load_rng_state_errors(make_driver, model) -> None:
    d = make_driver(model)
    with pytest.raises(DriverError, match="'cpu' entry"):
        d.load_rng_state({})
    with pytest.raises(DriverError, match=r"state\['cpu'\] is a Tensor of torch.float32.*uint8"):
        d.load_rng_state({"cpu": torch.zeros(3)})
    with pytest.raises(DriverError, match=r"unknown entr\(ies\) \['mps'\]"):
        d.load_rng_state({"cpu": torch.get_rng_state(), "mps": torch.get_rng_state()})


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message for a machine without CUDA")
def test_cuda_states_without_cuda_warn(make_driver, model) -> None:
    d = make_driver(model)
    cpu = torch.get_rng_state()
    with pytest.warns(UserWarning, match=r"CUDA random states for 1 device\(s\) but this machine has 0"):
        d.load_rng_state({"cpu": cpu, "cuda": [cpu]})
    assert torch.equal(torch.get_rng_state(), cpu)


def test_rng_state_does_not_start_cuda(make_driver, model) -> None:
    initialised = torch.cuda.is_available() and torch.cuda.is_initialized()
    make_driver(model).rng_state()
    assert (torch.cuda.is_available() and torch.cuda.is_initialized()) == initialised


@pytest.mark.gpu
def test_cuda_rng_state_round_trip(make_driver) -> None:
    model = DropoutNet().cuda().train()
    d = make_driver(model, "cuda")
    state = d.rng_state()
    assert len(state["cuda"]) == torch.cuda.device_count()
    first = model.drop(torch.ones(1000, device="cuda"))
    d.load_rng_state(_through_disk(d, state))
    assert torch.equal(first, model.drop(torch.ones(1000, device="cuda")))


def test_framework_version(make_driver, model) -> None:
    version = make_driver(model).framework_version()
    assert type(version) is str and version == torch.__version__


# ----------------------------------------------------------------------------- grad scaler
def _fp16_driver(make_driver, model, **scaler):
    kwargs = {"init_scale": 2.0**10, "growth_interval": 1, **scaler}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # fp16 on CPU is slow; fine for a few steps
        return make_driver(model, precision="fp16", framework_kwargs={"grad_scaler_kwargs": kwargs})


def test_grad_scaler_state_round_trip_under_fp16(make_driver, tiny_net_cls, batches) -> None:
    torch.manual_seed(0)
    model = tiny_net_cls()
    d = _fp16_driver(make_driver, model)
    d.set_optimizers(torch.optim.SGD(model.parameters(), lr=0.1))
    fn_sig = d.get_model_call_fn(None)
    for batch in batches[:3]:
        _step(d, batch, fn_sig)
        d.step()
        d.zero_grad()
    state = d.precision_state()
    assert state["scale"] == 2.0**13 and state["_growth_tracker"] == 0  # grew once per step
    saved_params = {k: v.clone() for k, v in d.model_state().items()}  # model_state() aliases the parameters
    saved_opt = d.optimizer_states()
    for batch in batches[3:6]:
        _step(d, batch, fn_sig)
        d.step()
        d.zero_grad()

    other = tiny_net_cls()
    d2 = _fp16_driver(make_driver, other, init_scale=1.0, growth_interval=50)  # overwritten by the state
    d2.set_optimizers(torch.optim.SGD(other.parameters(), lr=0.1))
    d2.load_model_state(saved_params)
    d2.load_optimizer_states(saved_opt)
    d2.load_precision_state(json.loads(json.dumps(state)))
    assert d2.precision_state() == state
    fn_sig2 = d2.get_model_call_fn(None)
    for batch in batches[3:6]:
        _step(d2, batch, fn_sig2)
        d2.step()
        d2.zero_grad()
    assert d2.precision_state() == d.precision_state()
    _assert_identical(_params(other), _params(model))


def test_precision_state_is_none_without_a_scaler(make_driver, model) -> None:
    d = make_driver(model, precision="bf16")
    assert d.precision_state() is None
    d.load_precision_state(None)
    with pytest.warns(UserWarning, match="holds a grad scaler state .* precision='bf16'.*ignored"):
        d.load_precision_state({"scale": 2.0})


def test_load_precision_state_errors_and_mismatches(make_driver, model) -> None:
    d = _fp16_driver(make_driver, model)
    with pytest.warns(UserWarning, match="no grad scaler state .* fresh GradScaler"):
        d.load_precision_state(None)
    with pytest.raises(DriverError, match="not a GradScaler state"):
        d.load_precision_state({})
    with pytest.raises(DriverError, match="needs the dict returned by precision_state"):
        d.load_precision_state(3.0)


# ----------------------------------------------------------------------------- optimizer states
def _adam_run(make_driver, model, batches, *, grad_clip=None):
    d = make_driver(model, grad_clip=grad_clip)
    d.set_optimizers(torch.optim.Adam(model.parameters(), lr=1e-2, betas=(0.8, 0.95), weight_decay=1e-3))
    return d


def _train_steps(d, batches) -> None:
    fn_sig = d.get_model_call_fn(None)
    for batch in batches:
        _step(d, batch, fn_sig)
        d.step()
        d.zero_grad()


@pytest.mark.parametrize("via_disk", [False, True], ids=["in_memory", "through_bytes_and_json"])
def test_optimizer_state_survives_rebuilding_model_and_optimizer(make_driver, tiny_net_cls, batches,
                                                                  via_disk) -> None:
    torch.manual_seed(0)
    model = tiny_net_cls()
    d = _adam_run(make_driver, model, batches, grad_clip=1.0)
    _train_steps(d, batches[:4])
    model_state = {k: v.clone() for k, v in d.model_state().items()}
    opt_states = d.optimizer_states()
    if via_disk:
        opt_states = _through_disk(d, opt_states)
    else:
        import copy

        opt_states = copy.deepcopy(opt_states)
    _train_steps(d, batches[4:])  # the uninterrupted run

    torch.manual_seed(123)  # a different initialisation: everything must come from the state
    fresh = tiny_net_cls()
    d2 = _adam_run(make_driver, fresh, batches, grad_clip=1.0)
    d2.load_model_state(model_state)
    d2.load_optimizer_states(opt_states)
    _train_steps(d2, batches[4:])
    _assert_identical(_params(fresh), _params(model))
    step = d2.optimizers[0].state[fresh.fc1.weight]["step"]
    assert torch.is_tensor(step) and step.dtype == torch.float32 and float(step) == len(batches)


def test_optimizer_state_keys_turned_into_strings_still_load(make_driver, tiny_net_cls, batches) -> None:
    """JSON makes torch's int parameter keys strings; torch would silently keep them as junk entries."""
    torch.manual_seed(0)
    model = tiny_net_cls()
    d = _adam_run(make_driver, model, batches)
    _train_steps(d, batches[:2])
    state = d.optimizer_states()[0]
    as_json = {**state, "state": {str(k): v for k, v in state["state"].items()}}
    fresh = tiny_net_cls()
    d2 = _adam_run(make_driver, fresh, batches)
    d2.load_optimizer_states([as_json])
    moments = d2.optimizers[0].state[fresh.fc2.bias]["exp_avg"]
    assert torch.equal(moments, d.optimizers[0].state[model.fc2.bias]["exp_avg"])
    assert all(isinstance(p, torch.nn.Parameter) for p in d2.optimizers[0].state)


def test_load_optimizer_states_errors(make_driver, model, batches) -> None:
    d = _adam_run(make_driver, model, batches)
    _train_steps(d, batches[:1])
    states = d.optimizer_states()
    with pytest.raises(DriverError, match=r"holds 2 optimizer state\(s\) but the trainer has 1"):
        d.load_optimizer_states(states * 2)
    with pytest.raises(DriverError, match=r"optimizer_states\[0\]\['state'\] has an entry for parameter '7'"):
        d.load_optimizer_states([{**states[0], "state": {"7": {}}}])
    with pytest.raises(DriverError, match=r"optimizer_states\[0\] is a list without 'state'"):
        d.load_optimizer_states([[1, 2]])
    with pytest.raises(DriverError, match="needs the list optimizer_states"):
        d.load_optimizer_states(states[0])
    small = _adam_run(make_driver, torch.nn.Linear(4, 8), batches)
    with pytest.raises(DriverError, match="load_optimizer_states: .*size.*same parameters, in the same groups"):
        small.load_optimizer_states(states)


# ----------------------------------------------------------------------------- reproducible DataLoader
def test_unshuffled_loader_gives_the_same_batches(make_driver, model) -> None:
    d = make_driver(model)
    original = DataLoader(_index_dataset(10), batch_size=3)
    repro = _repro(d, original)
    assert repro is not original and type(repro) is DataLoader
    sampler = find_reproducible_sampler(repro)
    assert isinstance(sampler, ReproducibleBatchSampler) and not sampler.shuffle
    assert _indices(repro) == _indices(original) == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    assert len(repro) == len(original) == 4


def test_shuffled_loader_permutes_per_epoch_reproducibly(make_driver, model) -> None:
    d = make_driver(model)

    def epochs(seed: int, n: int = 3) -> list[list[int]]:
        torch.manual_seed(seed)  # as with torch's own RandomSampler, the global torch seed decides the order
        repro = _repro(d, DataLoader(_index_dataset(12), batch_size=5, shuffle=True))
        out = []
        for epoch in range(n):
            d.set_sampler_epoch(repro, epoch)
            out.append(sum(_indices(repro), []))
        return out

    first = epochs(1)
    assert all(sorted(order) == list(range(12)) for order in first)
    assert len({tuple(order) for order in first}) == 3  # each epoch its own order
    assert first == epochs(1)
    assert first != epochs(2)


def test_user_generator_decides_the_order(make_driver, model) -> None:
    d = make_driver(model)

    def order(seed: int, where: str, global_seed: int) -> list[int]:
        torch.manual_seed(global_seed)  # irrelevant when the user gave a generator
        gen = torch.Generator().manual_seed(seed)
        dataset = _index_dataset(12)
        if where == "sampler":
            loader = DataLoader(dataset, batch_size=4, sampler=RandomSampler(dataset, generator=gen))
        else:
            loader = DataLoader(dataset, batch_size=4, shuffle=True, generator=gen)
        repro = _repro(d, loader)
        assert find_reproducible_sampler(repro).seed == seed
        return sum(_indices(repro), [])

    for where in ("sampler", "loader"):
        assert order(7, where, 1) == order(7, where, 2) != order(8, where, 1)


def test_python_random_does_not_decide_the_order(make_driver, model) -> None:
    d = make_driver(model)
    orders = []
    for python_seed in (1, 2):
        random.seed(python_seed)
        torch.manual_seed(0)
        orders.append(_indices(_repro(d, DataLoader(_index_dataset(12), batch_size=4, shuffle=True))))
    assert orders[0] == orders[1]


def test_resume_yields_exactly_the_tail(make_driver, model) -> None:
    d = make_driver(model)
    loader = DataLoader(_index_dataset(11), batch_size=3, shuffle=True)
    repro = _repro(d, loader)
    d.set_sampler_epoch(repro, 2)
    full = _indices(repro)
    sampler = find_reproducible_sampler(repro)

    resumed = _repro(d, DataLoader(_index_dataset(11), batch_size=3, shuffle=True))
    resumed_sampler = find_reproducible_sampler(resumed)
    resumed_sampler.load_state_dict(json.loads(json.dumps(sampler.state_dict())))
    d.set_sampler_epoch(resumed, 2)
    resumed_sampler.resume(2, sampler.consumed_samples(2))
    assert _indices(resumed) == full[2:]
    assert _indices(resumed) == full  # the next pass is the whole epoch again


def test_drop_last_and_collate_fn_are_kept(make_driver, model) -> None:
    d = make_driver(model)

    def collate(items):
        return {"idx": [int(item[0]) for item in items], "tag": "mine"}

    loader = DataLoader(_index_dataset(10), batch_size=4, drop_last=True, collate_fn=collate)
    repro = _repro(d, loader)
    assert repro.collate_fn is collate
    assert list(repro) == list(loader) == [{"idx": [0, 1, 2, 3], "tag": "mine"}, {"idx": [4, 5, 6, 7], "tag": "mine"}]
    assert len(repro) == 2


def test_an_explicit_default_batch_sampler_is_replaced(make_driver, model) -> None:
    d = make_driver(model)
    dataset = _index_dataset(9)
    batch_sampler = torch.utils.data.BatchSampler(torch.utils.data.SequentialSampler(dataset), 4, drop_last=True)
    repro = _repro(d, DataLoader(dataset, batch_sampler=batch_sampler))
    sampler = find_reproducible_sampler(repro)
    assert (sampler.batch_size, sampler.drop_last) == (4, True)
    assert _indices(repro) == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_every_setting_is_copied(make_driver, model) -> None:
    d = make_driver(model)

    def init(worker_id: int) -> None:  # pragma: no cover - runs in workers
        pass

    loader = DataLoader(NumpyDataset(), batch_size=4, shuffle=True, num_workers=2, pin_memory=False, timeout=30,
                        worker_init_fn=init, multiprocessing_context="fork", prefetch_factor=3,
                        persistent_workers=True, pin_memory_device="", in_order=False)
    repro = _repro(d, loader)
    for name in ("dataset", "num_workers", "collate_fn", "pin_memory", "timeout", "worker_init_fn",
                 "prefetch_factor", "persistent_workers", "pin_memory_device", "in_order"):
        assert getattr(repro, name) == getattr(loader, name), name
    assert repro.multiprocessing_context is loader.multiprocessing_context
    assert repro.generator is not None and repro.generator is not loader.generator


def test_workers_load_the_same_samples(make_driver, model) -> None:
    d = make_driver(model)
    torch.manual_seed(0)
    repro = _repro(d, DataLoader(NumpyDataset(), batch_size=4, shuffle=True, num_workers=2))
    d.set_sampler_epoch(repro, 1)
    batches = list(repro)
    order = find_reproducible_sampler(repro).order().tolist()
    assert sum((b["index"].tolist() for b in batches), []) == order
    dataset = NumpyDataset()
    assert np.array_equal(torch.cat([b["x"] for b in batches]).numpy(), dataset.x[order])


def test_user_generator_is_kept(make_driver, model) -> None:
    d = make_driver(model)
    gen = torch.Generator().manual_seed(3)
    repro = _repro(d, DataLoader(_index_dataset(), batch_size=2, shuffle=True, generator=gen))
    assert repro.generator is gen


def test_iterating_leaves_the_global_rng_alone(make_driver, model) -> None:
    d = make_driver(model)
    for kwargs in ({"shuffle": True}, {"shuffle": False}, {"shuffle": True, "num_workers": 2}):
        dataset = NumpyDataset() if kwargs.get("num_workers") else _index_dataset()
        repro = _repro(d, DataLoader(dataset, batch_size=3, **kwargs))
        before = torch.get_rng_state()
        d.set_sampler_epoch(repro, 1)
        iterator = iter(repro)
        next(iterator)
        list(iterator)
        assert torch.equal(torch.get_rng_state(), before), kwargs
    plain = DataLoader(_index_dataset(), batch_size=3)  # for contrast: torch's own loader draws a seed
    before = torch.get_rng_state()
    iter(plain)
    assert not torch.equal(torch.get_rng_state(), before)


def test_worker_seeds_depend_on_seed_and_epoch_only(make_driver, model) -> None:
    """A resumed run has iterated fewer epochs; its workers must still get the same base seed."""
    d = make_driver(model)

    def base_seed(loader, epoch: int) -> int:
        d.set_sampler_epoch(loader, epoch)
        return iter(loader)._base_seed

    torch.manual_seed(4)
    long_run = _repro(d, DataLoader(_index_dataset(), batch_size=3, shuffle=True))
    seeds = [base_seed(long_run, epoch) for epoch in range(3)]
    assert len(set(seeds)) == 3
    torch.manual_seed(5)  # a fresh process: the seed comes from the checkpoint
    resumed = _repro(d, DataLoader(_index_dataset(), batch_size=3, shuffle=True))
    find_reproducible_sampler(resumed).load_state_dict(find_reproducible_sampler(long_run).state_dict())
    assert base_seed(resumed, 2) == seeds[2]


@pytest.mark.parametrize("case", ["custom_sampler", "replacement", "num_samples", "iterable", "list", "subclass",
                                  "no_batching", "not_reproducible", "foreign_sampler"])
def test_other_loaders_are_left_alone(make_driver, model, case) -> None:
    d = make_driver(model)
    dataset = _index_dataset(8)

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(range(4))

    class MyLoader(DataLoader):
        pass

    loaders = {
        "custom_sampler": lambda: DataLoader(dataset, batch_size=2, sampler=WeightedRandomSampler([1.0] * 8, 8)),
        "replacement": lambda: DataLoader(dataset, batch_size=2, sampler=RandomSampler(dataset, replacement=True)),
        "num_samples": lambda: DataLoader(dataset, batch_size=2, sampler=RandomSampler(dataset, num_samples=4)),
        "iterable": lambda: DataLoader(Stream(), batch_size=2),
        "list": lambda: [{"x": torch.zeros(1)}],
        "subclass": lambda: MyLoader(dataset, batch_size=2),
        "no_batching": lambda: DataLoader(dataset, batch_size=None),
        "not_reproducible": lambda: DataLoader(dataset, batch_size=2),
        "foreign_sampler": lambda: DataLoader(dataset, batch_size=2, sampler=RandomSampler(_index_dataset(8))),
    }
    loader = loaders[case]()
    result = d.set_dist_repro_dataloader(loader, dist=None, reproducible=case != "not_reproducible")
    assert result is loader
    d.set_sampler_epoch(result, 1)  # harmless on anything


@pytest.mark.parametrize("dist", ["train", "eval"])
def test_sharding_is_refused_by_the_single_process_driver(make_driver, model, dist) -> None:
    """Asked to shard, the one-process driver says whose job that is rather than return the loader unsharded."""
    with pytest.raises(DriverError, match=rf"dist='{dist}'\): sharding data across processes needs the distributed "
                                          r"torch driver \(train distributed: device=\[0, 1\], nproc=N, or start the "
                                          r"script with torchrun\); TorchSingleDriver drives a single process\."):
        make_driver(model).set_dist_repro_dataloader(DataLoader(_index_dataset(8), batch_size=2), dist=dist,
                                                    reproducible=True)


def test_unknown_dist_value_is_refused(make_driver, model) -> None:
    with pytest.raises(DriverError, match=r"dist=True.*None, 'train' or 'eval'"):
        make_driver(model).set_dist_repro_dataloader([], dist=True, reproducible=True)


# ----------------------------------------------------------------------------- all together
def _run(make_driver, *, stop_after: int | None = None, resume: dict | None = None, accumulate: int = 3,
         epochs: int = 2, restore_rng: bool = True) -> tuple[list[torch.Tensor], dict | None]:
    """Train DropoutNet with shuffling and accumulation through driver methods only, as the Trainer does.

    ``stop_after=k`` stops after the k-th batch (counted over all epochs) and returns a checkpoint
    taken through bytes and JSON; ``resume`` starts a fresh process-like run from one.
    """
    random.seed(0)
    torch.manual_seed(0)
    model = DropoutNet()
    d = make_driver(model)
    d.set_optimizers(torch.optim.Adam(model.parameters(), lr=1e-2))
    loader = _repro(d, DataLoader(NumpyDataset(22), batch_size=4, shuffle=True))
    sampler = find_reproducible_sampler(loader)
    start_epoch, done = 0, 0
    if resume is not None:
        torch.manual_seed(999)  # a fresh process would have a different RNG position
        random.seed(999)
        ckpt = _join(resume["skeleton"], d.tensors_from_bytes(resume["bytes"]))
        d.load_model_state(ckpt["model"])
        d.load_optimizer_states(ckpt["optim"])
        d.load_gradient_state(ckpt["grads"])
        if restore_rng:
            d.load_rng_state(ckpt["rng"])
        sampler.load_state_dict(ckpt["sampler"])
        start_epoch, done = ckpt["epoch"], ckpt["done"]
    fn_sig = d.get_model_call_fn(None)
    d.set_model_mode("train")
    for epoch in range(start_epoch, epochs):
        d.set_sampler_epoch(loader, epoch)
        in_epoch = 0
        if resume is not None and epoch == start_epoch:
            in_epoch = ckpt["in_epoch"]
            sampler.resume(epoch, sampler.consumed_samples(in_epoch))
        for batch in loader:
            _step(d, batch, fn_sig)
            done += 1
            in_epoch += 1
            if done % accumulate == 0:
                d.step()
                d.zero_grad()
            if done == stop_after:
                state = {"model": d.model_state(), "optim": d.optimizer_states(), "grads": d.gradient_state(),
                         "rng": d.rng_state(), "sampler": sampler.state_dict(), "epoch": epoch,
                         "in_epoch": in_epoch, "done": done}
                tensors: dict = {}
                skeleton = json.loads(json.dumps(_split(state, tensors)))
                return [], {"skeleton": skeleton, "bytes": safetensors_writer.encode(d.tensor_file(tensors))}
    return _params(model), None


@pytest.mark.parametrize("stop_after", [1, 4, 5, 6, 7])  # mid-cycle, end of a cycle, end of epoch 0 (6 batches)
def test_resumed_run_ends_bit_identical(make_driver, stop_after) -> None:
    uninterrupted, _ = _run(make_driver)
    _, checkpoint = _run(make_driver, stop_after=stop_after)
    resumed, _ = _run(make_driver, resume=checkpoint)
    _assert_identical(resumed, uninterrupted)


def test_resume_without_the_rng_state_would_differ(make_driver) -> None:
    """Guards the test above: dropout really depends on the restored RNG."""
    uninterrupted, _ = _run(make_driver)
    _, checkpoint = _run(make_driver, stop_after=4)
    resumed, _ = _run(make_driver, resume=checkpoint, restore_rng=False)
    assert any(not torch.equal(a, b) for a, b in zip(resumed, uninterrupted, strict=True))
