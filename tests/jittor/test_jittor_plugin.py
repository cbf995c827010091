"""Discovery, capabilities and every bad input of the jittor driver, through the public API."""

from __future__ import annotations

import sys
import warnings

import numpy as np
import pytest

from drivetrain import DriverError, Trainer, available_drivers
from drivetrain.backend._plugins import create_driver, resolve_spec
from drivetrain_jittor.distributed import JittorMPIDriver
from drivetrain_jittor.driver import JittorSingleDriver

from .conftest import TinyNet, jt

pytestmark = pytest.mark.jittor


def test_spec_is_honest_about_amp_and_distributed():
    spec = available_drivers()["jittor"]
    assert spec.framework == "jittor" and spec.distribution == "drivetrain-jittor"
    caps = spec.capabilities
    assert caps.precisions == ("fp32", "fp16") and caps.distributed == ("mpi",)
    assert "process-wide" in caps.notes["fp16"] and "opt-in" in caps.notes["fp16"]
    assert "mpirun" in caps.notes["distributed"]
    assert "drivetrain[jittor]" in spec.install_command


def test_auto_picks_jittor_for_a_jittor_module(model):
    assert resolve_spec("auto", model).name == "jittor"
    driver = create_driver("auto", model, "cpu")
    assert isinstance(driver, JittorSingleDriver) and not isinstance(driver, JittorMPIDriver)
    assert driver.unwrap_model() is model


def test_a_torch_model_with_driver_jittor_names_the_driver_that_fits():
    torch = pytest.importorskip("torch")
    pytest.importorskip("drivetrain_torch")
    with pytest.raises(DriverError, match=r"not a jittor\.Module.*Use driver='torch'"):
        create_driver("jittor", torch.nn.Linear(2, 2), "cpu")


def test_other_wrong_models():
    with pytest.raises(DriverError, match="is a class; pass an instance, e.g. TinyNet()"):
        create_driver("jittor", TinyNet, "cpu")
    with pytest.raises(DriverError, match="no installed driver claims"):
        create_driver("jittor", object(), "cpu")


@pytest.mark.skipif(jt.has_cuda, reason="this machine has CUDA")
@pytest.mark.parametrize("device", ["cuda", "gpu", "cuda:0", 0])
def test_cuda_without_cuda_is_a_clear_error(model, device):
    with pytest.raises(DriverError, match=r"asks for a GPU, but jittor has no CUDA in this process.*device='cpu'"):
        create_driver("jittor", model, device)


@pytest.mark.parametrize("device, match", [
    ("tpu", "device kind the jittor driver does not support"),
    ("cuda:x", "not a device the jittor driver understands"),
    (-1, "must be >= 0"),
    (object(), "not a device"),
])
def test_unknown_devices(model, device, match):
    with pytest.raises(DriverError, match=match):
        create_driver("jittor", model, device)


@pytest.mark.skipif(not jt.has_cuda, reason="needs CUDA to reach the GPU-index rule")
@pytest.mark.gpu
def test_a_gpu_index_other_than_0_points_at_cuda_visible_devices(model):
    with pytest.raises(DriverError, match="CUDA_VISIBLE_DEVICES=1"):
        create_driver("jittor", model, "cuda:1")


@pytest.mark.parametrize("options", [{"nproc": 2}, {}])
def test_several_processes_outside_mpirun_say_how_to_launch(model, options):
    device = "cpu" if options else ["cpu", "cpu"]
    with pytest.raises(DriverError, match="mpirun -np 2 python"):
        create_driver("jittor", model, device, **options)


def test_fp16_is_refused_until_the_global_flag_is_accepted(model):
    with pytest.raises(DriverError, match=r"precision='fp16'.*process-wide.*jittor_kwargs=\{'amp_level': 4\}"):
        create_driver("jittor", model, "cpu", precision="fp16")
    with pytest.raises(DriverError, match="amp_level'\\]=3 is not accepted"):
        create_driver("jittor", model, "cpu", precision="fp16", framework_kwargs={"amp_level": 3})
    with pytest.raises(DriverError, match="but precision='fp32'"):
        create_driver("jittor", model, "cpu", framework_kwargs={"amp_level": 4})
    with pytest.raises(DriverError, match="not supported by driver 'jittor'"):
        create_driver("jittor", model, "cpu", precision="bf16")


def test_fp16_with_the_opt_in_warns_on_cpu_scopes_the_flag_and_trains(model, batches):
    with pytest.warns(UserWarning, match="precision='fp16' on CPU"):
        trainer = Trainer(model, batches, jt.optim.SGD(model.parameters(), lr=0.1), driver="jittor", device="cpu",
                          fp16=True, jittor_kwargs={"amp_level": 4}, progress_bar=None)
    seen = []
    trainer.add_callback_fn("on_before_backward", lambda t, out: seen.append(str(out["pred"].dtype)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.run(num_eval_sanity_batch=0)
    assert seen and set(seen) == {"float16"}, "the forward did not run in float16"
    assert jt.flags.auto_mixed_precision_level == 0, "the global AMP level leaked out of the forward"
    assert "auto_mixed_precision_level=4" in trainer.driver.describe()


def test_unknown_framework_options(model):
    with pytest.raises(DriverError, match=r"jittor_kwargs\['nope'\] is not an option"):
        create_driver("jittor", model, "cpu", framework_kwargs={"nope": 1})
    with pytest.raises(DriverError, match="argument of the jittor optimizer"):
        create_driver("jittor", model, "cpu", framework_kwargs={"param_sync_iter": 5})


def test_bad_optimizers_and_losses(model, make_driver):
    driver = make_driver(model)
    with pytest.raises(DriverError, match="is a class, not an optimizer"):
        driver.set_optimizers(jt.optim.SGD)
    other = TinyNet()
    with pytest.raises(DriverError, match="none of its 4 parameter"):
        driver.set_optimizers(jt.optim.SGD(other.parameters(), lr=0.1))
    with pytest.raises(DriverError, match=r"optimizers\[0\] and optimizers\[1\] both update"):
        driver.set_optimizers([jt.optim.SGD(model.parameters(), lr=0.1), jt.optim.SGD(model.parameters(), lr=0.1)])
    driver.set_optimizers(jt.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(DriverError, match="is a float"):
        driver.backward(1.5)
    with pytest.raises(DriverError, match=r"has shape \(3,\)"):
        driver.backward(jt.array(np.ones(3, np.float32)) * model.fc1.weight.sum())
    with pytest.raises(DriverError, match="does not require grad"):
        driver.backward(jt.array(np.ones(1, np.float32)).stop_grad())


def test_plugin_module_does_not_import_jittor():
    import subprocess

    code = ("import sys; import drivetrain_jittor.plugin, drivetrain_jittor; from drivetrain import available_drivers; "
            "available_drivers(); print('jittor' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr[-2000:]
