"""Devices for the oneflow driver: accepted spellings, and clear errors (never a process abort) without a GPU."""

from __future__ import annotations

import subprocess
import sys

import pytest

from drivetrain import Trainer
from drivetrain._common.errors import DriverError

from .conftest import flow

pytestmark = pytest.mark.oneflow

NO_GPU = not flow.cuda.is_available()


@pytest.mark.parametrize("device", ["cpu", "CPU", " cpu ", flow.device("cpu"), None])
def test_cpu_spellings(model, make_driver, device) -> None:
    d = make_driver(model, device=device)
    d.setup()
    assert d.device.type == "cpu"
    assert "device=cpu" in d.describe()


@pytest.mark.skipif(not NO_GPU, reason="checks the error on a machine without a GPU")
@pytest.mark.parametrize("device", ["cuda", "cuda:0", "gpu", "gpu:1", 0, 3, flow.device("cuda", 1)])
def test_gpu_without_cuda_is_a_clear_error(model, make_driver, device) -> None:
    with pytest.raises(DriverError, match=r"oneflow.cuda.is_available\(\) is False.*use device='cpu'"):
        make_driver(model, device=device)
    assert model.fc1.weight.device.type == "cpu"  # nothing was moved


@pytest.mark.skipif(not NO_GPU, reason="checks the error on a machine without a GPU")
def test_a_cuda_trainer_in_a_fresh_process_fails_with_an_error_not_an_abort() -> None:
    """oneflow aborts the whole process (SIGABRT) on a bad .to('cuda'); the driver must refuse first."""
    script = (
        "import oneflow as flow\n"
        "from drivetrain import Trainer, DriverError\n"
        "m = flow.nn.Linear(2, 2)\n"
        "try:\n"
        "    Trainer(m, [{'x': flow.ones(1, 2)}], flow.optim.SGD(m.parameters(), lr=0.1), driver='oneflow',\n"
        "            device='cuda', progress_bar=None)\n"
        "except DriverError as exc:\n"
        "    print('REFUSED', exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env={"GLOG_minloglevel": "2", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "REFUSED device='cuda' asks for a GPU" in done.stdout


@pytest.mark.parametrize(
    ("device", "fragment"),
    [
        ("mps", "is not a device the oneflow driver supports"),
        ("cuda:x", "'x' is not a device index"),
        (-1, "a GPU index must be >= 0"),
        (True, "is not a device"),
        (1.5, r"\(a float\) is not accepted"),
    ],
)
def test_bad_devices_name_what_is_accepted(model, make_driver, device, fragment) -> None:
    with pytest.raises(DriverError, match=fragment) as info:
        make_driver(model, device=device)
    assert "accepted" in str(info.value)


def test_the_trainer_reports_a_bad_device_at_construction(model) -> None:
    with pytest.raises(DriverError, match="device='tpu'"):
        Trainer(model, [{"x": flow.ones(1, 4)}], flow.optim.SGD(model.parameters(), lr=0.1), driver="oneflow",
                device="tpu", progress_bar=None)


def test_a_model_that_is_not_a_oneflow_module_is_refused(make_driver) -> None:
    with pytest.raises(DriverError, match="is a class; pass an instance"):
        make_driver(flow.nn.Linear)
    with pytest.raises(DriverError, match="the oneflow driver needs a oneflow.nn.Module"):
        make_driver(object())


@pytest.mark.gpu
def test_cuda_device_trains(make_driver, batches) -> None:
    from .conftest import tiny_net

    net = tiny_net()
    d = make_driver(net, device="cuda")
    d.set_optimizers(flow.optim.SGD(net.parameters(), lr=0.1))
    d.setup()
    assert net.fc1.weight.device.type == "cuda"
    batch = d.move_data_to_device(batches[0])
    assert batch["x"].device.type == "cuda"
    fn, sig = d.get_model_call_fn(None)
    d.backward(d.model_call(batch, fn, sig)["loss"])
    d.step()
