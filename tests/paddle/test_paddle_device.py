"""Device arguments: aliases, None, and the errors for everything else (on this CPU build of paddle)."""

from __future__ import annotations

import pytest

from drivetrain import Trainer
from drivetrain._common.errors import DriverError

from .conftest import paddle

HAS_GPU = paddle.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0


@pytest.mark.parametrize("device", ["cpu", "CPU", " cpu ", None, ["cpu"]])
def test_cpu_devices(model, make_driver, device) -> None:
    d = make_driver(model, device)
    assert d.device.name == "cpu"
    d.setup()
    assert paddle.get_device() == "cpu"
    assert all(p.place.is_cpu_place() for p in model.parameters())


def test_a_cpu_place_is_accepted(model, make_driver) -> None:
    assert make_driver(model, paddle.CPUPlace()).device.name == "cpu"


def test_setup_keeps_parameter_identity(model, make_driver) -> None:
    before = [id(p) for p in model.parameters()]
    d = make_driver(model, "cpu")
    d.setup()
    assert [id(p) for p in model.parameters()] == before


@pytest.mark.skipif(HAS_GPU, reason="checks the error on a build or machine without a GPU")
@pytest.mark.parametrize("device", ["gpu", "gpu:0", "cuda", "cuda:1", "GPU:0", 0, 3])
def test_gpu_on_a_cpu_build_is_a_clear_error(model, device) -> None:
    with pytest.raises(DriverError) as info:
        Trainer(model, [{"x": paddle.zeros([2, 4])}], paddle.optimizer.SGD(parameters=model.parameters()),
                driver="paddle", device=device)
    message = str(info.value)
    assert f"device={device!r} asks for a GPU" in message
    assert "paddle.is_compiled_with_cuda() is False" in message
    assert "device='cpu'" in message and "paddlepaddle-gpu==3.3.1" in message


@pytest.mark.parametrize(
    "device, fragment",
    [
        ("xpu", "is a device kind ('xpu') the paddle driver does not support"),
        ("mps", "device kind ('mps')"),
        ("gpu:x", "not a device the paddle driver understands"),
        ("tpu:0", "device kind ('tpu')"),
        (-1, ">= 0"),
        (True, "is not a device"),
        (1.5, "(a float) is not accepted"),
        ({"gpu": 0}, "(a dict) is not accepted"),
    ],
)
def test_bad_devices_name_the_argument_and_what_is_accepted(model, make_driver, device, fragment) -> None:
    with pytest.raises(DriverError) as info:
        make_driver(model, device)
    message = str(info.value)
    assert f"device={device!r}" in message
    assert fragment in message
    assert "'cpu', 'gpu', 'gpu:N', 'cuda', 'cuda:N'" in message


def test_several_devices_point_to_the_distributed_driver(model, make_driver) -> None:
    # distributed: refused here because this build has no GPU, or (GPU build) because pytest cannot be re-run
    with pytest.raises(DriverError, match="paddle build has no CUDA|runs under pytest"):
        make_driver(model, ["gpu:0", "gpu:1"])


def test_model_must_be_a_layer(make_driver, tiny_net_cls) -> None:
    with pytest.raises(DriverError, match=r"model=.*is a class; pass an instance"):
        make_driver(tiny_net_cls)
    with pytest.raises(DriverError, match=r"paddle.nn.Layer"):
        make_driver(object())


@pytest.mark.gpu
def test_gpu_device_moves_the_model_and_batches(model, make_driver) -> None:
    d = make_driver(model, "gpu:0")
    d.setup()
    assert all(p.place.is_gpu_place() for p in model.parameters())
    batch = d.move_data_to_device({"x": paddle.zeros([2, 4]).cpu()})
    assert batch["x"].place.is_gpu_place()
