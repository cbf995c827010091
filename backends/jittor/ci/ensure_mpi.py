"""Make sure OpenMPI (mpirun, mpicc) is there for the jittor MPI tests; install it from Debian if we may.

jittor's data parallelism is MPI: ``mpicc`` must exist when jittor is first imported (it
compiles its MPI extension then) and ``mpirun`` starts the processes. Run by the tox env
``jittor`` before the tests: on a Debian/Ubuntu machine where this runs as root, a
missing OpenMPI is installed (``apt-get install openmpi-bin libopenmpi-dev``); otherwise
the command to run is printed and the env fails, rather than skipping the MPI tests.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

PACKAGES = ["openmpi-bin", "libopenmpi-dev"]


def missing() -> list[str]:
    return [tool for tool in ("mpirun", "mpicc") if shutil.which(tool) is None]


def main() -> int:
    if not missing():
        return 0
    apt = shutil.which("apt-get")
    if apt is None or os.geteuid() != 0:
        print(f"{', '.join(missing())} not found; install OpenMPI first: sudo apt-get install -y {' '.join(PACKAGES)}",
              file=sys.stderr)
        return 1
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for command in ([apt, "update", "-qq"], [apt, "install", "-y", "-qq", *PACKAGES]):
        print("+", " ".join(command), flush=True)
        if subprocess.run(command, env=env).returncode != 0:
            print(f"could not install OpenMPI ({' '.join(command)} failed)", file=sys.stderr)
            return 1
    return 1 if missing() else 0


if __name__ == "__main__":
    sys.exit(main())
