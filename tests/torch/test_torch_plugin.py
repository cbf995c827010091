"""The torch backend is found through its entry point without importing torch until it is chosen."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from drivetrain.backend._plugins import available_drivers, resolve_spec

FRAMEWORKS = ("torch", "paddle", "jittor", "oneflow")


def _run(code: str) -> dict:
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_discovery_does_not_import_torch() -> None:
    out = _run(
        "import json, sys\n"
        "import drivetrain.backend._plugins as p\n"
        "import drivetrain_torch, drivetrain_torch.plugin\n"
        "specs = p.available_drivers()\n"
        f"loaded = sorted(m for m in sys.modules if m.split('.')[0] in {FRAMEWORKS!r})\n"
        "print(json.dumps({'drivers': sorted(specs), 'loaded': loaded}))\n"
    )
    assert "torch" in out["drivers"]
    assert out["loaded"] == []


def test_choosing_the_driver_imports_torch_lazily() -> None:
    out = _run(
        "import json, sys\n"
        "from drivetrain.backend._plugins import resolve_spec\n"
        "spec = resolve_spec('torch', None)\n"
        "before = 'torch' in sys.modules\n"
        "import importlib; importlib.import_module(spec.factory.partition(':')[0])\n"
        "print(json.dumps({'before': before, 'after': 'torch' in sys.modules}))\n"
    )
    assert out == {"before": False, "after": True}


def test_spec_describes_the_driver_honestly() -> None:
    spec = available_drivers()["torch"]
    assert spec.framework == "torch"
    assert spec.factory == "drivetrain_torch.factory:create_driver"
    assert spec.distribution == "drivetrain-torch"
    assert spec.version() == "0.1.0"
    caps = spec.capabilities
    assert caps.precisions == ("fp32", "fp16", "bf16")
    assert caps.distributed == ("ddp",)
    assert "torchrun" in caps.notes["distributed"]
    assert set(caps.devices) == {"cpu", "cuda"}
    assert "bf16" in caps.notes["fp16"] and "CPU" in caps.notes["fp16"]


def test_auto_claims_torch_modules_only(model) -> None:
    assert resolve_spec("auto", model).name == "torch"
    assert resolve_spec("auto", torch.nn.Sequential(torch.nn.Linear(2, 2))).name == "torch"
    assert not available_drivers()["torch"].claims(object())


@pytest.mark.parametrize("driver", ["torch", "auto"])
def test_factory_builds_the_single_driver(model, make_driver, driver) -> None:
    from drivetrain_torch.driver import TorchSingleDriver

    d = make_driver(model, "cpu", driver=driver)
    assert isinstance(d, TorchSingleDriver)
    assert d.name == "torch"
    assert not d.is_distributed() and d.world_size == 1 and d.rank == 0 and d.is_global_zero
    assert "cpu" in d.describe()
