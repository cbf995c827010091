"""docs/backends/jittor.md runs: its ``python no-run`` blocks in order, its ``python no-run mpi`` script under mpirun.

The general docs environment has no jittor, so the page's blocks are fenced
``python no-run`` there and executed here instead, the way tests/docs runs a page:
one shared namespace, in a fresh working directory.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ..docs.test_examples import code_blocks

PAGE = Path(__file__).resolve().parents[2] / "docs" / "backends" / "jittor.md"

pytestmark = pytest.mark.jittor


def blocks(info: str) -> list:
    found = [b for b in code_blocks(PAGE.read_text(encoding="utf-8")) if b.info == info]
    assert found, f"{PAGE.name} has no ```{info} blocks"
    return found


@pytest.mark.timeout(300)
def test_page_blocks_run_in_order(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "docs_jittor"}
    for block in blocks("python no-run"):
        code = compile("\n" * (block.line - 1) + block.code, str(PAGE), "exec")
        exec(code, namespace)  # a failure points at the page's own line


@pytest.mark.distributed
@pytest.mark.timeout(300)
@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not found")
def test_the_mpi_script_runs_under_mpirun(tmp_path):
    (script,) = blocks("python no-run mpi")
    path = tmp_path / "train.py"
    path.write_text(script.code, encoding="utf-8")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    proc = subprocess.Popen([shutil.which("mpirun"), "-np", "2", "--oversubscribe", sys.executable, str(path)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp_path,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"the documented MPI script hung:\n{output[-3000:]}")
    assert proc.returncode == 0, output[-3000:]
    assert "jittor driver (JittorMPIDriver) rank 0/2" in output
