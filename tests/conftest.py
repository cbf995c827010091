"""Shared pytest setup: single-threaded frameworks (2-core machine) and skip reasons."""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
