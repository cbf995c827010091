"""``driver="deepspeed"`` as a package of its own (drivetrain-deepspeed) on drivetrain-torch's extension API.

- without the package, ``driver="deepspeed"`` says what to install;
- a checkpoint ``driver="deepspeed"`` wrote while it lived inside drivetrain-torch (kept in
  ``data/deepspeed-0.1.0-zero3-world1``: ZeRO-3, one process, stopped after ``INTERRUPT_AT``
  batches by ``_deepspeed_script.py OUT interrupt``) loads into the package's driver with the
  weights it recorded, and resumes to the run ``driver="torch"`` makes from it;
- the boundary: drivetrain-torch never names DeepSpeed, and drivetrain_deepspeed imports nothing of
  drivetrain-torch but :mod:`drivetrain_torch.extension` (and nothing private of drivetrain).
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import child_env, max_diff, run_to_end

ROOT = Path(__file__).resolve().parents[3]
TORCH_PACKAGE = ROOT / "backends" / "torch"
DEEPSPEED_PACKAGE = ROOT / "backends" / "deepspeed" / "drivetrain_deepspeed"
OLD = Path(__file__).with_name("data") / "deepspeed-0.1.0-zero3-world1"
SCRIPT = str(Path(__file__).with_name("_deepspeed_script.py"))
FP32 = 1e-6

pytestmark = [pytest.mark.torch]


def test_without_the_package_driver_deepspeed_names_the_package_to_install() -> None:
    """The package left out (as if not installed): the error names drivetrain-deepspeed's install command."""
    code = ("import torch\nfrom drivetrain import Trainer\nm = torch.nn.Linear(2, 2)\n"
            "Trainer(m, [1], torch.optim.SGD(m.parameters(), lr=0.1), driver='deepspeed', progress_bar=None)\n")
    env = {**child_env(), "DRIVETRAIN_PLUGINS_DENY": "deepspeed"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("drivetrain._common.errors.DriverNotFoundError: driver='deepspeed' is not installed"), last
    assert "pip install -c constraints.txt -e . -e backends/torch -e backends/deepspeed" in last
    assert 'pip install "drivetrain[deepspeed]"' in last


def test_drivetrain_torch_never_names_deepspeed() -> None:
    named = [f"{path.relative_to(ROOT)}:{number}" for path in sorted(TORCH_PACKAGE.rglob("*"))
             if path.is_file() and path.suffix in (".py", ".toml") and "egg-info" not in str(path)
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if "deepspeed" in line.lower()]
    assert not named, f"drivetrain-torch names DeepSpeed (an engine built on it must stay in its own package): {named}"


ALLOWED_DRIVETRAIN = {"drivetrain", "drivetrain.backend", "drivetrain.testing", "drivetrain_torch.extension"}


def test_drivetrain_deepspeed_imports_only_the_public_apis() -> None:
    found = []
    for path in sorted(DEEPSPEED_PACKAGE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            found += [f"{path.name}: {name}" for name in names
                      if name.startswith("drivetrain") and name not in ALLOWED_DRIVETRAIN]
    assert not found, f"drivetrain_deepspeed imports beyond {sorted(ALLOWED_DRIVETRAIN)}: {found}"


@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_a_checkpoint_written_before_the_move_loads_and_resumes(tmp_path) -> None:
    pytest.importorskip("deepspeed", reason="driver='deepspeed' needs pip install -e backends/deepspeed deepspeed")
    pytest.importorskip("drivetrain_deepspeed", reason="driver='deepspeed' needs pip install -e backends/deepspeed")
    folder = OLD / "checkpoint"
    run_to_end([sys.executable, SCRIPT, str(tmp_path), "ddp-resume-other,load-other,resume-other", "--other",
                str(folder)], tmp_path, 200)
    recorded = json.loads((OLD / "params.json").read_text())["params"]
    loaded = json.loads((tmp_path / "load-other-rank0.json").read_text())
    assert loaded["driver"] == "TorchDeepSpeedDriver"
    assert loaded["params"] == recorded  # bit for bit what the old driver held when it saved
    resumed = json.loads((tmp_path / "resume-other-rank0.json").read_text())
    plain = json.loads((tmp_path / "ddp-resume-other-rank0.json").read_text())
    assert resumed["driver"] == "TorchDeepSpeedDriver" and plain["driver"] == "TorchSingleDriver"
    assert max_diff(resumed["params"], plain["params"]) < FP32
    assert max_diff(resumed["params"], recorded) > 0  # it trained on from there
    assert os.listdir(folder) and json.loads((folder / "manifest.json").read_text())["driver"] == "torch"


@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_drivetrain_backends_check_deepspeed_passes() -> None:
    """The contract checks on driver='deepspeed' (a world of one), the two that checkpoint inside an accumulation
    cycle waived by its kit with the reason."""
    pytest.importorskip("deepspeed", reason="driver='deepspeed' needs pip install -e backends/deepspeed deepspeed")
    pytest.importorskip("drivetrain_deepspeed", reason="driver='deepspeed' needs pip install -e backends/deepspeed")
    done = subprocess.run([sys.executable, "-m", "drivetrain", "backends", "--check", "deepspeed"],
                          capture_output=True, text=True, timeout=240, env=child_env())
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "20/20 checks passed, 2 waived by the kit" in done.stdout
    assert "WAIVED gradient_state_round_trip" in done.stdout and "FAILED" not in done.stdout
