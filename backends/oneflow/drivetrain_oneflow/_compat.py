"""Which Python and which oneflow this backend runs on, checked before oneflow is imported.

OneFlow publishes one working release for this backend, 0.9.0, with wheels for
Python <= 3.10 only. On Python 3.11 pip instead finds oneflow 0.7.0 as a small
``py3-none-any`` wheel without its native library: it installs, then fails at
import. This module imports no framework, so it can explain that on any Python.
"""

from __future__ import annotations

import importlib.metadata
import sys

SUPPORTED_ONEFLOW = "0.9.0"
PYTHON_MIN = (3, 10)
PYTHON_MAX = (3, 10)
INSTALL = (
    f'pip install oneflow=={SUPPORTED_ONEFLOW} "numpy<2" nvidia-cudnn-cu11==8.5.0.96 nvidia-cublas-cu11==11.10.3.66'
)
"""The framework's install line measured to work (in a Python 3.10 environment), CPU-only machines included;
what an environment holding this backend still needs."""
PYTHON_HINT = (
    "create a Python 3.10 environment (e.g. pyenv install 3.10.13; "
    "$(pyenv root)/versions/3.10.13/bin/python -m venv .venv-oneflow) and run there, from a drivetrain checkout: "
    "pip install -c constraints.txt -e . -e backends/oneflow, then " + INSTALL
)


def runtime_problem(python: tuple[int, ...] | None = None, oneflow_version: str | None | bool = False) -> str | None:
    """Why the oneflow driver cannot run here (wrong Python, missing or unusable oneflow), or None.

    ``python`` defaults to this interpreter's version, ``oneflow_version`` to the installed
    distribution's (None: not installed); both are parameters so the rule can be tested anywhere.
    """
    python = tuple(sys.version_info[:3]) if python is None else tuple(python)
    shown = ".".join(str(n) for n in python)
    if not PYTHON_MIN <= python[:2] <= PYTHON_MAX:
        return (
            f"the oneflow driver needs Python 3.10, but this is Python {shown}: OneFlow publishes working wheels "
            f"(oneflow {SUPPORTED_ONEFLOW}) only for Python <= 3.10, and on newer Pythons pip installs oneflow 0.7.0, "
            f"which has no native library and cannot run. To train with oneflow, {PYTHON_HINT}"
        )
    if oneflow_version is False:
        oneflow_version = installed_oneflow()
    if oneflow_version is None:
        return f"the oneflow driver needs oneflow {SUPPORTED_ONEFLOW}, which is not installed; run: {INSTALL}"
    if str(oneflow_version).split("+")[0] != SUPPORTED_ONEFLOW:
        return (
            f"the oneflow driver is built and tested for oneflow {SUPPORTED_ONEFLOW}, but oneflow {oneflow_version} is "
            f"installed (its API differs); run: {INSTALL}"
        )
    return None


def installed_oneflow() -> str | None:
    """The installed oneflow distribution's version, or None."""
    try:
        return importlib.metadata.version("oneflow")
    except importlib.metadata.PackageNotFoundError:
        return None
