"""docs/backends/oneflow.md runs: its ```python oneflow blocks, in order, in one namespace, on Python 3.10.

The docs env (Python 3.11) cannot import oneflow, so the page marks its examples
``python oneflow`` (shown as Python, skipped by tests/docs) and they run here instead.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[2] / "docs" / "backends" / "oneflow.md"
_BLOCK = re.compile(r"^```python oneflow\n(.*?)^```$", re.S | re.M)


@pytest.mark.oneflow
@pytest.mark.slow
def test_the_oneflow_page_runs(tmp_path, monkeypatch, capsys) -> None:
    blocks = _BLOCK.findall(PAGE.read_text(encoding="utf-8"))
    assert len(blocks) >= 5, "the page lost its runnable examples"
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "oneflow_docs"}
    for number, code in enumerate(blocks, 1):
        try:
            exec(compile(code, f"{PAGE.name} block {number}", "exec"), namespace)  # noqa: S102 - our own docs
        except Exception as exc:  # noqa: BLE001
            pytest.fail(f"{PAGE.name}, block {number} failed: {type(exc).__name__}: {exc}\n{code}")
    out = capsys.readouterr().out
    if not namespace["flow"].cuda.is_available():
        assert "device='cuda' asks for a GPU but oneflow.cuda.is_available() is False" in out
    assert "0.0125" in out and "32" in out
