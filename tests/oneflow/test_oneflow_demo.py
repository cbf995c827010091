"""The demo runs on oneflow and learns: ``python examples/digits.py --driver oneflow``."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("sklearn")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "digits.py"


@pytest.mark.oneflow
@pytest.mark.slow
def test_digits_demo_reaches_95_percent_on_oneflow(capsys) -> None:
    spec = importlib.util.spec_from_file_location("digits_example", EXAMPLE)
    digits = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(digits)
    accuracy = digits.main(["--driver", "oneflow", "--progress-bar", "none"])
    assert accuracy >= 0.95
    assert "dev accuracy:" in capsys.readouterr().out
