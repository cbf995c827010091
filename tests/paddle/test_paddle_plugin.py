"""The paddle backend is found through its entry point without importing paddle until it is chosen."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from drivetrain import seed_everything
from drivetrain.backend._plugins import available_drivers, resolve_spec

from .conftest import paddle

FRAMEWORKS = ("torch", "paddle", "jittor", "oneflow")


def _run(code: str) -> dict:
    env = dict(os.environ, GLOG_minloglevel="2")
    result = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True,
                            timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_discovery_and_the_package_do_not_import_paddle() -> None:
    out = _run(
        "import json, sys\n"
        "import drivetrain.backend._plugins as p\n"
        "import drivetrain_paddle, drivetrain_paddle.plugin\n"
        "specs = p.available_drivers()\n"
        f"loaded = sorted(m for m in sys.modules if m.split('.')[0] in {FRAMEWORKS!r})\n"
        "print(json.dumps({'drivers': sorted(specs), 'loaded': loaded}))\n"
    )
    assert "paddle" in out["drivers"]
    assert out["loaded"] == []


def test_choosing_the_driver_imports_paddle_lazily() -> None:
    out = _run(
        "import json, sys\n"
        "from drivetrain.backend._plugins import resolve_spec\n"
        "spec = resolve_spec('paddle', None)\n"
        "before = 'paddle' in sys.modules\n"
        "import importlib; importlib.import_module(spec.factory.partition(':')[0])\n"
        "print(json.dumps({'before': before, 'after': 'paddle' in sys.modules}))\n"
    )
    assert out == {"before": False, "after": True}


def test_spec_describes_the_driver_honestly() -> None:
    spec = available_drivers()["paddle"]
    assert spec.framework == "paddle"
    assert spec.factory == "drivetrain_paddle.factory:create_driver"
    assert spec.distribution == "drivetrain-paddle"
    assert spec.version() == "0.1.0"
    assert "paddlepaddle==3.3.1" in spec.install_command
    caps = spec.capabilities
    assert caps.precisions == ("fp32", "fp16", "bf16")
    assert caps.distributed == ("ddp", "fleet")
    assert set(caps.devices) == {"cpu", "gpu"}
    for precision in ("fp16", "bf16"):  # the CPU truth is stated, not hidden
        assert "no" in caps.notes[precision] and "CPU" in caps.notes[precision] and "fp32" in caps.notes[precision]


def test_auto_claims_paddle_layers_only(model) -> None:
    assert resolve_spec("auto", model).name == "paddle"
    assert resolve_spec("auto", paddle.nn.Sequential(paddle.nn.Linear(2, 2))).name == "paddle"
    assert not available_drivers()["paddle"].claims(object())


@pytest.mark.parametrize("driver", ["paddle", "auto"])
def test_factory_builds_the_single_driver(model, make_driver, driver) -> None:
    from drivetrain_paddle.driver import PaddleSingleDriver

    d = make_driver(model, "cpu", driver=driver)
    assert isinstance(d, PaddleSingleDriver)
    assert d.name == "paddle"
    assert not d.is_distributed() and d.world_size == 1 and d.rank == 0 and d.is_global_zero
    assert "device=cpu" in d.describe() and paddle.__version__ in d.describe()
    assert d.framework_version() == paddle.__version__


def test_seed_everything_seeds_paddle() -> None:
    seed_everything(123)
    a = paddle.rand([4]).numpy()
    seed_everything(123)
    b = paddle.rand([4]).numpy()
    assert (a == b).all()


def test_export_inference_model_is_importable_without_touching_paddle_first() -> None:
    out = _run(
        "import json, sys\n"
        "import drivetrain_paddle\n"
        "before = 'paddle' in sys.modules\n"
        "fn = drivetrain_paddle.export_inference_model\n"
        "print(json.dumps({'before': before, 'name': fn.__name__, 'all': drivetrain_paddle.__all__}))\n"
    )
    assert out == {"before": False, "name": "export_inference_model", "all": ["__version__", "export_inference_model"]}
