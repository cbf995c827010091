"""tox's install command for the oneflow env: pip install, with the pinned wheels kept in a wheelhouse.

oneflow 0.9.0 and its cuDNN/cuBLAS wheels are ~1.9 GB, and pip's own HTTP cache does not
keep them here (the package index's responses are not stored). So every ``name==version``
requirement given to this command is first looked up in the wheelhouse
(``$DRIVETRAIN_WHEELHOUSE``, default ``~/.cache/drivetrain/wheels``), downloaded into it
once with ``pip download`` when missing, and installed from there without the network;
then the whole list is installed as usual, finding those already satisfied.

    python backends/oneflow/ci/pip_install_cached.py [pip options] REQUIREMENT...
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!_-]+)$")


def wheelhouse() -> str:
    default = os.path.join(os.path.expanduser("~"), ".cache", "drivetrain", "wheels")
    path = os.environ.get("DRIVETRAIN_WHEELHOUSE") or default
    os.makedirs(path, exist_ok=True)
    return path


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def cached(folder: str, name: str, version: str) -> bool:
    """Whether a wheel of ``name`` ``version`` lies in ``folder`` (wheel names: ``name-version-tags.whl``)."""
    for filename in os.listdir(folder):
        parts = filename[:-4].split("-") if filename.endswith(".whl") else []
        if len(parts) >= 2 and _normal(parts[0]) == _normal(name) and parts[1] == version:
            return True
    return False


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args], check=True)


def main(argv: list[str]) -> int:
    folder = wheelhouse()
    pins = [arg for arg in argv if PIN.match(arg)]
    started = time.monotonic()
    missing = [spec for spec in pins if not cached(folder, *PIN.match(spec).groups())]
    if missing:
        print(f"pip_install_cached: downloading {missing} into {folder}", flush=True)
        pip("download", "--no-deps", "--only-binary=:all:", "--dest", folder, *missing)
    if pins:
        pip("install", "--no-index", "--find-links", folder, "--no-deps", *pins)
    pip("install", "--find-links", folder, *argv)
    print(f"pip_install_cached: {len(pins)} pinned wheel(s) from {folder} ({len(missing)} downloaded); "
          f"{time.monotonic() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
