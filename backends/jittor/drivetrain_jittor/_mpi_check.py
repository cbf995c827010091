"""Whether jittor's MPI extension can compile here, asked before ``import jittor`` tries.

``import jittor`` compiles its MPI extension whenever an ``mpicc`` is on the PATH. Debian's
``openmpi-bin`` brings ``mpirun`` and the ``mpicc`` wrapper without the headers
(``libopenmpi-dev``), and then every ``import jittor`` dies with a compiler trace on
``mpi.h: No such file or directory`` -- one process runs included, though it needs no MPI.
:func:`mpi_header_problem` preprocesses ``#include <mpi.h>`` with that ``mpicc`` (tens of
milliseconds) so the import can go on without MPI on one process, or stop with the fix
under ``mpirun``.
"""

from __future__ import annotations

import os
import shutil
import subprocess

HEADERS_FIX = ("install the MPI development headers: `apt-get install libopenmpi-dev` (Debian, Ubuntu), "
               "`dnf install openmpi-devel` (Fedora, RHEL), or your system's OpenMPI development package")


def under_mpirun() -> bool:
    """Whether this process was started by OpenMPI's ``mpirun`` (the launcher jittor's MPI support reads)."""
    return "OMPI_COMM_WORLD_SIZE" in os.environ


def mpi_header_problem() -> str | None:
    """Why the ``mpicc`` jittor would use cannot compile against ``mpi.h``; None when it can, when there is
    no ``mpicc`` (jittor then runs without MPI by itself), or when the user chose (``mpicc_path``/``use_mpi``)."""
    if "mpicc_path" in os.environ or os.environ.get("use_mpi", "1") != "1":
        return None
    mpicc = shutil.which("mpicc")
    if mpicc is None:
        return None
    try:
        done = subprocess.run([mpicc, "-E", "-x", "c", "-"], input="#include <mpi.h>\n", capture_output=True,
                              text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{mpicc} could not be run ({exc})"
    if done.returncode == 0:
        return None
    lines = [line.strip() for line in done.stderr.splitlines() if "mpi.h" in line or "error" in line]
    return f"{mpicc} cannot compile against mpi.h ({(lines or ['exit status ' + str(done.returncode)])[0]})"
