"""Discovery of the oneflow driver, and what users on the wrong Python or oneflow are told."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from drivetrain import available_drivers
from drivetrain.backend._plugins import resolve_spec
from drivetrain_oneflow._compat import INSTALL, runtime_problem

from .conftest import flow, tiny_net

pytestmark = pytest.mark.oneflow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BACKEND = os.path.join(ROOT, "backends", "oneflow")


def test_spec_is_registered_through_the_entry_point() -> None:
    spec = available_drivers()["oneflow"]
    assert (spec.framework, spec.distribution, spec.factory) == ("oneflow", "drivetrain-oneflow",
                                                                 "drivetrain_oneflow.factory:create_driver")
    assert spec.capabilities.distributed == ("ddp",) and spec.contract_versions
    assert "Python 3.10" in spec.install_command and "oneflow==0.9.0" in spec.install_command
    assert resolve_spec("auto", tiny_net()).name == "oneflow"
    assert resolve_spec("auto", flow.nn.Sequential()).name == "oneflow"


def test_this_environment_is_supported() -> None:
    assert runtime_problem() is None


@pytest.mark.parametrize(("python", "version", "fragments"), [
    ((3, 11, 7), "0.7.0", ["needs Python 3.10, but this is Python 3.11.7", "oneflow 0.7.0", INSTALL]),
    ((3, 12, 1), None, ["this is Python 3.12.1", "pyenv"]),
    ((3, 9, 18), "0.9.0", ["this is Python 3.9.18"]),
    ((3, 10, 13), None, ["oneflow 0.9.0, which is not installed", INSTALL]),
    ((3, 10, 13), "0.8.1", ["oneflow 0.8.1 is installed", INSTALL]),
    ((3, 10, 13), "0.9.0+cu117", None),
])
def test_runtime_problems_say_which_python_and_which_install_line_work(python, version, fragments) -> None:
    problem = runtime_problem(python=python, oneflow_version=version)
    if fragments is None:
        assert problem is None
        return
    for fragment in fragments:
        assert fragment in problem


def _python311() -> str | None:
    for candidate in (os.path.join(ROOT, ".venv", "bin", "python"), shutil.which("python3.11")):
        if candidate and os.path.exists(candidate):
            check = subprocess.run([candidate, "-c", "import sys, drivetrain; print(sys.version_info[:2])"],
                                   capture_output=True, text=True, timeout=60)
            if check.returncode == 0 and "(3, 11)" in check.stdout:
                return candidate
    return None


def test_a_python_311_user_asking_for_oneflow_is_told_which_python_works() -> None:
    """On 3.11, with the backend's code importable (e.g. installed with --ignore-requires-python) and
    whatever pip offers as oneflow: the factory refuses before importing oneflow, naming Python 3.10."""
    python = _python311()
    if python is None:
        pytest.skip("needs a Python 3.11 interpreter with drivetrain installed (the repository's .venv)")
    script = (
        "import sys\n"
        f"sys.path.insert(0, {BACKEND!r})\n"
        "from drivetrain import DriverError, DrivetrainError, Trainer, available_drivers\n"
        "from drivetrain.backend._plugins import register_plugin\n"
        "import drivetrain_oneflow.plugin as plugin\n"
        "if 'oneflow' not in available_drivers():  # found through the source tree's egg-info, or not\n"
        "    register_plugin(plugin, name='oneflow')\n"
        "class Model: pass\n"
        "try:\n"
        "    Trainer(Model(), [], None, driver='oneflow', progress_bar=None)\n"
        "except DrivetrainError as exc:  # DriverNotFoundError: no usable oneflow on this Python\n"
        "    print('TRAINER:', exc)\n"
        "try:\n"
        "    import drivetrain_oneflow.factory\n"
        "except DriverError as exc:\n"
        "    print('FACTORY:', exc)\n"
        "print('imported oneflow:', 'oneflow' in sys.modules)\n"
    )
    done = subprocess.run([python, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = dict(line.split(":", 1) for line in done.stdout.splitlines() if ":" in line)
    assert "Python 3.10" in lines["TRAINER"], done.stdout  # the spec's install line names the Python
    assert "needs Python 3.10, but this is Python 3.11" in lines["FACTORY"], done.stdout
    assert "oneflow==0.9.0" in lines["FACTORY"]
    assert lines["imported oneflow"].strip() == "False"
