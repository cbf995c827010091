"""The demo runs on oneflow and learns: ``python examples/digits.py --driver oneflow``."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("sklearn")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "digits.py"


@pytest.mark.oneflow
@pytest.mark.slow
def test_digits_demo_reaches_95_percent_on_oneflow(capsys, tmp_path) -> None:
    spec = importlib.util.spec_from_file_location("digits_example", EXAMPLE)
    digits = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(digits)
    accuracy = digits.main(["--driver", "oneflow", "--progress-bar", "none", "--run-dir", str(tmp_path)])
    assert accuracy >= 0.95
    assert "dev accuracy:" in capsys.readouterr().out
    with open(tmp_path / "metrics.jsonl") as f:  # the run record: a loss every 10 batches, one evaluation per epoch
        rows = [json.loads(line) for line in f]
    assert [row["eval/acc#acc#dev"] for row in rows if "eval/acc#acc#dev" in row][-1] == pytest.approx(accuracy)
    assert sum("train/loss" in row for row in rows) >= 15
