"""An author's first hour: copy this example, rename it, build it, install it; the checks pass under the new name.

The copy is built as a wheel and installed into a private folder (``pip install --target``),
so the new backend is found only through its own entry point, exactly as after
``pip install drivetrain-<name>``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from drivetrain.testing import CHECKS

HERE = Path(__file__).resolve().parent.parent
NEW = "mynp"


def rename(text: str) -> str:
    text = text.replace("drivetrain_numpy", f"drivetrain_{NEW}").replace("drivetrain-numpy", f"drivetrain-{NEW}")
    text = re.sub(r'\b(name|driver) ?= ?"numpy"', rf'\1="{NEW}"', text)  # the driver's name, not the framework
    return re.sub(r"^numpy = ", f"{NEW} = ", text, flags=re.MULTILINE)  # the entry point


def test_a_renamed_copy_installs_and_passes_the_checks(tmp_path):
    source = tmp_path / "src"
    shutil.copytree(HERE / "drivetrain_numpy", source / f"drivetrain_{NEW}")
    shutil.copy(HERE / "pyproject.toml", source / "pyproject.toml")
    shutil.copy(HERE / "README.md", source / "README.md")
    for path in [source / "pyproject.toml", *(source / f"drivetrain_{NEW}").glob("*.py")]:
        path.write_text(rename(path.read_text()))

    wheels, target = tmp_path / "wheels", tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(source)],
                   check=True, timeout=240)
    (wheel,) = wheels.glob(f"drivetrain_{NEW}-*.whl")
    subprocess.run([*pip, "install", "--no-deps", "--target", str(target), str(wheel)], check=True, timeout=240)

    env = dict(os.environ, PYTHONPATH=str(target))
    result = subprocess.run([sys.executable, "-c",
                             "import sys; from drivetrain._cli import main; sys.exit(main(['backends', '--check', "
                             f"'{NEW}']))"], capture_output=True, text=True, env=env, timeout=240, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"contract checks for '{NEW}' (drivetrain-{NEW} 0.1.0, framework numpy)" in result.stdout
    assert f"{len(CHECKS)}/{len(CHECKS)} checks passed" in result.stdout
