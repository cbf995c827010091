"""Importing jittor through drivetrain-jittor: environment defaults, no torch, a status line, no side effects.

Each case runs in a fresh interpreter (the environment is read at jittor's import),
with the warm compile cache, so it takes seconds.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from drivetrain_jittor._import import environment_defaults

from .._signals import popen_interruptible, read_until

pytestmark = pytest.mark.jittor

_JITTOR_ENV = ("nvcc_path", "use_mkl", "FIX_TORCH_ERROR", "mkl_lib_path")


def run_python(code: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in _JITTOR_ENV}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env={**base, **(env or {})}, timeout=timeout)


def last_json(result: subprocess.CompletedProcess) -> dict:
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(150)
def test_import_sets_defaults_keeps_torch_out_and_the_users_random_state():
    result = run_python("""
        import json, os, random, sys
        import numpy as np
        from drivetrain_jittor import import_jittor  # imports drivetrain (and rich, which draws from random)
        random.seed(3); np.random.seed(3)
        want = (random.random(), float(np.random.random()))
        random.seed(3); np.random.seed(3)
        jt = import_jittor()
        got = (random.random(), float(np.random.random()))
        from drivetrain_jittor._import import _onednn_installed
        print(json.dumps({"torch": "torch" in sys.modules, "same_random": want == got, "onednn": _onednn_installed(),
                          "env": {k: os.environ.get(k) for k in ("nvcc_path", "use_mkl", "FIX_TORCH_ERROR")},
                          "has_cuda": bool(jt.has_cuda)}))
    """)
    out = last_json(result)
    assert out["torch"] is False, "import jittor imported torch"
    assert out["same_random"] is True, "import jittor reseeded python's or numpy's generator"
    assert out["env"]["FIX_TORCH_ERROR"] == "0"
    assert out["env"]["use_mkl"] == (None if out["onednn"] else "0")  # without oneDNN jittor would download it
    if out["env"]["nvcc_path"] == "":
        assert out["has_cuda"] is False


@pytest.mark.timeout(150)
def test_the_users_own_settings_win():
    result = run_python("""
        import json, os
        from drivetrain_jittor import prepare_environment
        print(json.dumps({"set": prepare_environment(),
                          "env": {k: os.environ.get(k) for k in ("nvcc_path", "use_mkl", "FIX_TORCH_ERROR")}}))
    """, env={"nvcc_path": "/nowhere/nvcc", "use_mkl": "0", "FIX_TORCH_ERROR": "1"})
    out = last_json(result)
    assert out["set"] == {}
    assert out["env"] == {"nvcc_path": "/nowhere/nvcc", "use_mkl": "0", "FIX_TORCH_ERROR": "1"}


def test_nvcc_path_is_left_alone_where_an_nvidia_driver_answers(monkeypatch):
    for key in _JITTOR_ENV:
        monkeypatch.delenv(key, raising=False)
    assert "nvcc_path" not in environment_defaults(cuda_usable=lambda: True)
    assert environment_defaults(cuda_usable=lambda: False)["nvcc_path"] == ""


@pytest.mark.timeout(150)
def test_a_slow_import_is_announced_with_its_duration():
    result = run_python("""
        from drivetrain_jittor import import_jittor
        import_jittor(notice_after=0.0)
    """)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "drivetrain-jittor: importing jittor is taking more than 0 s" in result.stderr
    assert "compiles jittor's C++ core" in result.stderr
    assert "drivetrain-jittor: jittor imported in" in result.stderr


@pytest.mark.timeout(150)
def test_ctrl_c_raises_keyboard_interrupt_and_a_killed_child_does_not_end_the_process():
    """jittor's C handlers would end the process at once on SIGINT and on a child killed by a signal; after
    import_jittor() Python's handlers are back. The child says when it waits inside the ``try`` (and which SIGINT
    handler it has), so the signal is sent after that line and never races it."""
    code = """
        import os, signal, subprocess, sys, time
        from drivetrain_jittor import import_jittor
        import_jittor()
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        print("survived the killed child", flush=True)
        try:
            print("sigint handler:", signal.getsignal(signal.SIGINT) is signal.default_int_handler, flush=True)
            print("waiting for SIGINT", flush=True)
            time.sleep(30)
        except KeyboardInterrupt:
            print("KeyboardInterrupt", flush=True)
    """
    base = {k: v for k, v in os.environ.items() if k not in _JITTOR_ENV}
    proc = popen_interruptible([sys.executable, "-c", textwrap.dedent(code)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=base)
    try:
        read_until(proc, "survived the killed child", "after the killed child")
        assert proc.stdout.readline().strip() == "sigint handler: True"
        read_until(proc, "waiting for SIGINT", "before the SIGINT")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "KeyboardInterrupt" in out, err[-2000:]


def _headerless_mpicc(tmp_path) -> dict[str, str]:
    """A PATH whose mpicc finds no mpi.h, as Debian's openmpi-bin without libopenmpi-dev: it prints compile flags
    but preprocessing ``#include <mpi.h>`` fails. (On a warm compile cache jittor itself would not notice: the
    failure shows on a machine whose cache has no MPI extension yet.)"""
    folder = tmp_path / "bin"
    folder.mkdir()
    fake = folder / "mpicc"
    fake.write_text("#!/bin/sh\n"
                    "if [ \"$1\" = -E ]; then echo '<stdin>:1:10: fatal error: mpi.h: No such file or directory' >&2;"
                    " exit 1; fi\n"
                    "echo -I/nonexistent/openmpi/include\n")
    fake.chmod(0o755)
    return {"PATH": f"{folder}{os.pathsep}{os.environ['PATH']}"}


@pytest.mark.timeout(150)
def test_an_mpicc_without_mpi_h_leaves_one_process_without_mpi_and_says_so(tmp_path):
    """Half an MPI install (mpirun and mpicc, no headers): one process imports jittor, without MPI, and one line
    says why and what to install for mpirun; no compiler trace."""
    result = run_python("""
        import json, os
        from drivetrain_jittor import import_jittor
        jt = import_jittor()
        print(json.dumps({"mpicc_path": os.environ.get("mpicc_path"), "in_mpi": bool(jt.in_mpi),
                          "trained": float((jt.array([1.0, 2.0]) * 2).sum().item())}))
    """, env=_headerless_mpicc(tmp_path))
    out = last_json(result)
    assert out == {"mpicc_path": "", "in_mpi": False, "trained": 6.0}
    notices = [line for line in result.stderr.splitlines() if "drivetrain-jittor:" in line and "mpi.h" in line]
    assert len(notices) == 1 and "libopenmpi-dev" in notices[0], result.stderr[-2000:]
    assert "Traceback" not in result.stderr


@pytest.mark.timeout(150)
def test_an_mpicc_without_mpi_h_under_mpirun_stops_with_the_fix(tmp_path):
    """Under mpirun the user asked for MPI: the import stops at once, naming the package that brings mpi.h."""
    result = run_python("""
        from drivetrain_jittor import import_jittor
        try:
            import_jittor()
        except ImportError as exc:
            print("refused:", exc)
    """, env={**_headerless_mpicc(tmp_path), "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "0"})
    assert result.returncode == 0, result.stderr[-2000:]
    assert "refused:" in result.stdout and "mpirun" in result.stdout, result.stdout
    assert "apt-get install libopenmpi-dev" in result.stdout and "mpi.h" in result.stdout


def test_a_working_mpicc_is_left_to_jittor(monkeypatch):
    """With the headers installed (this machine: ensure_mpi.py installs libopenmpi-dev) nothing is changed."""
    from drivetrain_jittor._mpi_check import mpi_header_problem

    monkeypatch.delenv("mpicc_path", raising=False)
    monkeypatch.delenv("use_mpi", raising=False)
    assert mpi_header_problem() is None
    monkeypatch.setenv("mpicc_path", "/somewhere/mpicc")
    assert mpi_header_problem() is None  # the user's choice is the user's
