#!/usr/bin/env bash
# Creates the venvs bench/peers.py runs in (not part of CI), every version pinned:
#   DIR/peers    torch 2.13.0 (CPU), drivetrain (editable), Lightning Fabric, pytorch-ignite,
#                accelerate, transformers, matplotlib: these share one venv, one process.
#   DIR/fastnlp  torch 2.13.0 and fastNLP 1.0.1 alone: fastNLP pins rich==11.2.0 (drivetrain needs
#                rich>=13) and imports pkg_resources (gone from setuptools>=81), so it gets its own
#                venv and bench/peers.py runs it in a subprocess of that venv.
#
#   bash bench/peers_setup.sh [DIR]        # default /tmp/peers-venvs
#   DIR/peers/bin/python bench/peers.py --write-docs
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DIR="${1:-/tmp/peers-venvs}"
PY="${PYTHON:-python3.11}"
# Every install goes through the constraints file: an unpinned torch pulls gigabytes of CUDA wheels.
PIP=(-m pip install -q -c "$ROOT/constraints.txt")

"$PY" -m venv "$DIR/peers"
"$DIR/peers/bin/python" "${PIP[@]}" torch==2.13.0 lightning-fabric==2.6.6 pytorch-ignite==0.5.5 \
    accelerate==1.15.0 transformers==5.24.0 matplotlib==3.11.2 -e "$ROOT" -e "$ROOT/backends/torch"

"$PY" -m venv "$DIR/fastnlp"
"$DIR/fastnlp/bin/python" "${PIP[@]}" torch==2.13.0 fastNLP==1.0.1 "setuptools<81" \
    || echo "fastNLP did not install; bench/peers.py will report it as skipped"

"$DIR/peers/bin/python" -m pip list 2>/dev/null \
    | grep -iE '^(torch|lightning-fabric|pytorch-ignite|accelerate|transformers|matplotlib|drivetrain) '
"$DIR/fastnlp/bin/python" -m pip list 2>/dev/null | grep -iE '^(torch|fastnlp) ' || true
