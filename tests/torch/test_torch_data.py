"""Batches and tensors: moving nested batches, converting to numpy, checking dataloaders."""

from __future__ import annotations

import collections
import dataclasses
from typing import NamedTuple

import numpy as np
import pytest
import torch

from drivetrain._common.errors import DriverError


class Pair(NamedTuple):
    x: torch.Tensor
    label: str


@dataclasses.dataclass
class Sample:
    x: torch.Tensor
    meta: dict
    count: int = 0


@dataclasses.dataclass(frozen=True)
class FrozenSample:
    x: torch.Tensor
    derived: int = dataclasses.field(init=False, default=7)


def _nested() -> dict:
    return {
        "a": torch.ones(2),
        "list": [torch.zeros(1), "text", 3],
        "tuple": (torch.ones(1), None),
        "pair": Pair(torch.ones(3), "cat"),
        "sample": Sample(torch.ones(2), {"inner": [torch.ones(1)]}, 5),
        "frozen": FrozenSample(torch.ones(1)),
        "ordered": collections.OrderedDict(k=torch.ones(1)),
        "default": collections.defaultdict(list, k=torch.ones(1)),
        "array": np.ones(2),
    }


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v)
    elif dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            yield from _tensors(getattr(obj, f.name))


def test_cpu_batch_on_cpu_comes_back_as_is(model, make_driver) -> None:
    d = make_driver(model)
    batch = _nested()
    assert d.move_data_to_device(batch) is batch
    for leaf in ([1, 2], "s", 3, None, np.ones(2)):
        assert d.move_data_to_device(leaf) is leaf


def test_nested_batch_is_rebuilt_with_moved_tensors() -> None:
    """Without a GPU, 'meta' is a second device CPU tensors can move to: it exercises every rebuild path."""
    from drivetrain_torch._device import move_to_device

    batch = _nested()
    moved = move_to_device(batch, torch.device("meta"))
    _check_moved(moved, batch, torch.device("meta"))
    assert all(t.device.type == "cpu" for t in _tensors(batch))
    assert moved["tuple"] is not batch["tuple"] and type(moved["tuple"]) is tuple
    untouched = {"only": "strings", "n": [1, 2]}
    assert move_to_device(untouched, torch.device("meta")) is untouched


def _batch_on(device: str) -> dict:
    batch = _nested()
    for key in ("a",):
        batch[key] = batch[key].to(device)
    batch["list"][0] = batch["list"][0].to(device)
    batch["pair"] = Pair(batch["pair"].x.to(device), "cat")
    batch["sample"].meta["inner"][0] = batch["sample"].meta["inner"][0].to(device)
    batch["frozen"] = FrozenSample(batch["frozen"].x.to(device))
    batch["default"]["k"] = batch["default"]["k"].to(device)
    return batch


def _check_moved(moved: dict, original: dict, device: torch.device) -> None:
    assert all(t.device == device for t in _tensors(moved))
    assert type(moved["pair"]) is Pair and moved["pair"].label == "cat"
    assert type(moved["sample"]) is Sample and moved["sample"].count == 5
    assert moved["sample"] is not original["sample"]  # a new instance, the user's batch is untouched
    assert type(moved["frozen"]) is FrozenSample and moved["frozen"].derived == 7
    assert type(moved["ordered"]) is collections.OrderedDict
    assert type(moved["default"]) is collections.defaultdict and moved["default"].default_factory is list
    assert moved["list"][1:] == ["text", 3] and moved["tuple"][1] is None
    assert moved["array"] is original["array"]


@pytest.mark.gpu
def test_nested_batch_moves_to_the_gpu(model, make_driver) -> None:
    d = make_driver(model, "cuda")
    batch = _nested()
    moved = d.move_data_to_device(batch)
    _check_moved(moved, batch, torch.device("cuda", 0))
    assert all(t.device.type == "cpu" for t in _tensors(batch))


@pytest.mark.gpu
def test_gpu_batch_moves_back_to_the_cpu(model, make_driver) -> None:
    d = make_driver(model, "cpu")
    batch = _batch_on("cuda")
    _check_moved(d.move_data_to_device(batch), batch, torch.device("cpu"))


def test_tensor_to_numpy(model, make_driver) -> None:
    d = make_driver(model)
    t = torch.tensor([1.5, 2.5], requires_grad=True) * 2
    arr = d.tensor_to_numpy(t)
    assert isinstance(arr, np.ndarray) and arr.dtype == np.float32
    np.testing.assert_array_equal(arr, [3.0, 5.0])
    src = torch.arange(3)
    copy = d.tensor_to_numpy(src)
    src += 10  # the array is a copy, not a view of the tensor's memory
    np.testing.assert_array_equal(copy, [0, 1, 2])
    for dtype in (torch.bfloat16, torch.float16):
        low = d.tensor_to_numpy(torch.tensor([0.5, -2.0], dtype=dtype))
        assert low.dtype == np.float32
        np.testing.assert_array_equal(low, [0.5, -2.0])
    assert d.tensor_to_numpy(torch.tensor(3.0)).shape == ()
    assert d.tensor_to_numpy(2.5) == np.asarray(2.5)
    np.testing.assert_array_equal(d.tensor_to_numpy(np.ones(2)), np.ones(2))
    assert d.tensor_to_numpy(torch.tensor([True])).dtype == np.bool_


def test_is_tensor(model, make_driver) -> None:
    d = make_driver(model)
    assert d.is_tensor(torch.zeros(1))
    assert d.is_tensor(torch.nn.Parameter(torch.zeros(1)))
    assert not d.is_tensor(np.zeros(1))
    assert not d.is_tensor([1.0])


def test_dataloader_legality(model, make_driver) -> None:
    d = make_driver(model)
    dataset = torch.utils.data.TensorDataset(torch.zeros(4, 2))
    d.check_dataloader_legality(torch.utils.data.DataLoader(dataset, batch_size=2))
    d.check_dataloader_legality([{"x": torch.zeros(2)}], "evaluate_dataloaders")
    d.check_dataloader_legality(iter([1, 2]))
    with pytest.raises(
        DriverError, match=r"^train_dataloader=TensorDataset is a Dataset, not a dataloader.*DataLoader\("
    ):
        d.check_dataloader_legality(dataset)
    with pytest.raises(DriverError, match="^evaluate_dataloaders=int is not iterable"):
        d.check_dataloader_legality(3, "evaluate_dataloaders")


def test_set_sampler_epoch_reaches_a_distributed_style_sampler(model, make_driver) -> None:
    class EpochSampler(torch.utils.data.Sampler):
        def __init__(self) -> None:
            self.epoch = -1

        def set_epoch(self, epoch: int) -> None:
            self.epoch = epoch

        def __iter__(self):
            return iter(range(4))

        def __len__(self) -> int:
            return 4

    sampler = EpochSampler()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.zeros(4)), sampler=sampler)
    d = make_driver(model)
    d.set_sampler_epoch(loader, 3)
    assert sampler.epoch == 3
    d.set_sampler_epoch([1, 2], 3)  # plain iterables are left alone


def test_driver_works_with_a_real_dataloader(model, make_driver) -> None:
    x = torch.randn(32, 4)
    y = (x[:, 0] > 0).long()
    samples = [{"x": x[i], "y": y[i]} for i in range(32)]  # default collate stacks them into dict batches
    loader = torch.utils.data.DataLoader(samples, batch_size=8, shuffle=False)
    d = make_driver(model)
    d.set_optimizers(torch.optim.SGD(model.parameters(), lr=0.1))
    fn, sig = d.get_model_call_fn(None)
    for batch in loader:
        batch = d.move_data_to_device(batch)
        d.backward(d.model_call(batch, fn, sig)["loss"])
        d.step()
        d.zero_grad()
