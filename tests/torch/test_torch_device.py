"""Device arguments: aliases, None, and the errors for everything else."""

from __future__ import annotations

import pytest
import torch

from drivetrain._common.errors import DriverError


@pytest.mark.parametrize("device", ["cpu", "CPU", " cpu ", torch.device("cpu"), None])
def test_cpu_devices(model, make_driver, device) -> None:
    d = make_driver(model, device)
    assert d.device == torch.device("cpu")
    d.setup()
    assert next(model.parameters()).device.type == "cpu"


def test_none_keeps_the_model_where_it_is(make_driver) -> None:
    bufferless = torch.nn.Module()  # no parameters at all: CPU
    assert make_driver(bufferless, None).device == torch.device("cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without a GPU")
@pytest.mark.parametrize("device", ["cuda", "cuda:0", "gpu", "gpu:1", 0, torch.device("cuda")])
def test_cuda_without_gpu_is_a_clear_error(model, make_driver, device) -> None:
    with pytest.raises(DriverError, match=r"torch.cuda.is_available\(\) is False.*device='cpu'") as info:
        make_driver(model, device)
    assert "device=" in str(info.value)


@pytest.mark.parametrize(
    "device, fragment",
    [
        ("tpu", "not a device torch understands"),
        ("cuda:x", "not a device torch understands"),
        ("meta", "'meta' device"),
        (-1, ">= 0"),
        (True, "is not a device"),
        (1.5, "(a float) is not accepted"),
        ({"cuda": 0}, "(a dict) is not accepted"),
    ],
)
def test_bad_devices_name_the_argument_and_what_is_accepted(model, make_driver, device, fragment) -> None:
    with pytest.raises(DriverError) as info:
        make_driver(model, device)
    message = str(info.value)
    assert f"device={device!r}" in message
    assert fragment in message
    assert "'cpu', 'cuda', 'cuda:N'" in message


def test_device_lists_choose_between_one_and_several_processes(model, make_driver) -> None:
    """A one-device list is that device; several devices mean distributed training (tests/torch/distributed)."""
    assert make_driver(model, ["cpu"]).device == torch.device("cpu")
    with pytest.raises(DriverError, match="lists the CPU 2 times"):
        make_driver(model, ["cpu", "cpu"])


def test_model_must_be_a_module(make_driver) -> None:
    with pytest.raises(DriverError, match=r"model=.*torch.nn.Module"):
        make_driver(lambda x: x, "cpu", driver="torch")
    with pytest.raises(DriverError, match="is a class; pass an instance"):
        make_driver(torch.nn.Linear, "cpu", driver="torch")


def test_bad_options_are_rejected(model, make_driver) -> None:
    with pytest.raises(DriverError, match="precision='fp8'"):
        make_driver(model, precision="fp8")
    with pytest.raises(DriverError, match="grad_clip=-1"):
        make_driver(model, grad_clip=-1)
    with pytest.raises(DriverError, match=r"torch_kwargs\['bogus'\].*accepted: grad_scaler_kwargs"):
        make_driver(model, framework_kwargs={"bogus": 1})
    with pytest.raises(DriverError, match="distributed"):
        make_driver(model, framework_kwargs={"ddp_kwargs": {}})
    with pytest.raises(DriverError, match=r"torch_kwargs\['non_blocking'\]='yes' must be True or False"):
        make_driver(model, framework_kwargs={"non_blocking": "yes"})
    with pytest.raises(DriverError, match="only applies to precision='fp16'"):
        make_driver(model, framework_kwargs={"grad_scaler_kwargs": {"init_scale": 8.0}})


def test_torch_kwargs_arrive_through_backend_kwargs(model) -> None:
    from drivetrain.backend._plugins import create_driver

    other = {"paddle": {"whatever": 1}}  # another framework's options are not the torch driver's business
    d = create_driver("torch", model, "cpu", backend_kwargs={"torch": {"set_to_none": False}, **other})
    assert d.set_to_none is False
    with pytest.raises(DriverError, match=r"torch_kwargs\['nope'\]"):
        create_driver("auto", model, "cpu", backend_kwargs={"torch": {"nope": 1}})


@pytest.mark.gpu
@pytest.mark.parametrize("device", ["cuda", "gpu", 0, "cuda:0", torch.device("cuda", 0)])
def test_gpu_aliases(model, make_driver, device) -> None:
    d = make_driver(model, device)
    assert d.device == torch.device("cuda", 0)
    d.setup()
    assert next(model.parameters()).device == torch.device("cuda", 0)


@pytest.mark.gpu
def test_gpu_index_out_of_range(model, make_driver) -> None:
    count = torch.cuda.device_count()
    with pytest.raises(DriverError, match=f"sees {count} CUDA device"):
        make_driver(model, f"cuda:{count}")


@pytest.mark.gpu
def test_none_follows_a_model_on_the_gpu(model, make_driver) -> None:
    model.to("cuda:0")
    assert make_driver(model, None).device == torch.device("cuda", 0)
