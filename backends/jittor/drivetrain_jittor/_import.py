"""Importing jittor safely: the environment it needs, a status line while it compiles, no side effects.

``import jittor`` on a plain machine does more than import:

- it looks for ``nvcc`` and, when it finds one, builds CUDA support -- which fails where a
  CUDA toolkit is installed but no NVIDIA driver is (containers, CI machines); with no
  ``nvcc`` at all it may try to download its own CUDA toolkit. ``nvcc_path=`` (empty)
  tells it to stay on the CPU;
- with ``use_mkl`` unset it downloads oneDNN, and the import fails without a network;
- outside MPI it imports torch (``FIX_TORCH_ERROR``), seconds of work and memory the user
  never asked for;
- it reseeds python's and numpy's global generators from the clock;
- it installs C signal handlers that end the process at once on Ctrl-C (no
  ``KeyboardInterrupt``, so no checkpoint on the way out) and whenever *any* child
  process dies of a signal (a killed subprocess takes the trainer down with it);
- the first import on a machine compiles jittor's C++ core: minutes, silent apart from
  jittor's own progress counter.

:func:`prepare_environment` sets those variables only where the user has not set them
(and ``nvcc_path`` only where no NVIDIA driver answers, so GPU machines keep CUDA);
:func:`import_jittor` applies it, says on stderr that jittor may be compiling when the
import is slow, keeps the user's python/numpy random state and puts back the SIGINT and
SIGCHLD handlers the process had (jittor's dataset workers, ``num_workers > 0``, then no
longer end the main process when one is killed; drivetrain reads datasets without
them). A process that imported
jittor already is left alone: the environment is read at jittor's import, so setting it
later would change nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from types import ModuleType

import numpy as np

from ._mpi_check import HEADERS_FIX, mpi_header_problem, under_mpirun

SLOW_IMPORT_NOTICE_S = 5.0
"""Seconds of importing after which the status line says jittor is compiling."""

_TORCH_ENV = "FIX_TORCH_ERROR"


def cuda_driver_usable() -> bool:
    """Whether an NVIDIA driver answers with at least one device (``cuInit`` + ``cuDeviceGetCount``).

    Loading ``libcuda.so.1`` and asking it costs milliseconds and imports nothing;
    a CUDA toolkit without a driver (or a stub library) fails here.
    """
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    try:
        if lib.cuInit(0) != 0:
            return False
        count = ctypes.c_int(0)
        return lib.cuDeviceGetCount(ctypes.byref(count)) == 0 and count.value > 0
    except AttributeError:
        return False


def _onednn_installed() -> bool:
    """Whether jittor already downloaded oneDNN (then ``use_mkl`` may stay jittor's default)."""
    home = os.environ.get("JITTOR_HOME", os.path.expanduser("~"))
    folder = os.path.join(home, ".cache", "jittor", "mkl")
    try:
        return any(name.startswith("dnnl") for name in os.listdir(folder))
    except OSError:
        return False


def environment_defaults(cuda_usable: Callable[[], bool] = cuda_driver_usable) -> dict[str, str]:
    """The variables :func:`prepare_environment` would set, with the reason for each left out.

    Only variables absent from ``os.environ`` are returned; an empty value counts as set.
    """
    defaults: dict[str, str] = {}
    if _TORCH_ENV not in os.environ:
        defaults[_TORCH_ENV] = "0"  # never import torch from inside `import jittor`
    if "use_mkl" not in os.environ and "mkl_lib_path" not in os.environ and not _onednn_installed():
        defaults["use_mkl"] = "0"  # no oneDNN download at import
    if "nvcc_path" not in os.environ and not cuda_usable():
        defaults["nvcc_path"] = ""  # no NVIDIA driver: CPU only, no CUDA build or toolkit download
    return defaults


def prepare_environment() -> dict[str, str]:
    """Set jittor's import-time variables where the user has not; return what was set.

    An ``mpicc`` that cannot compile jittor's MPI extension (no ``mpi.h``) is left out on one
    process (``mpicc_path=""``, said in one line) and stops the import under ``mpirun`` with the
    fix. Does nothing once jittor is imported (jittor read its environment then).
    """
    if "jittor" in sys.modules:
        return {}
    defaults = environment_defaults()
    problem = mpi_header_problem()
    if problem is not None:
        if under_mpirun():
            raise ImportError(f"drivetrain-jittor: this process runs under mpirun, but {problem}, so jittor cannot "
                              f"build its MPI support; {HEADERS_FIX}.")
        defaults["mpicc_path"] = ""
        _say(f"drivetrain-jittor: {problem}; jittor runs without MPI in this process (one process needs none). "
             f"For mpirun, {HEADERS_FIX}.")
    for key, value in defaults.items():
        os.environ.setdefault(key, value)
    return defaults


def _cache_hint() -> str:
    home = os.environ.get("JITTOR_HOME", os.path.expanduser("~"))
    return os.path.join(home, ".cache", "jittor")


def _say(text: str) -> None:
    try:
        sys.stderr.write(text + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):  # a closed stream must not break the import
        pass


@contextlib.contextmanager
def _slow_import_notice(after: float) -> Iterator[None]:
    """Writes one status line if the body takes longer than ``after`` seconds, and the total when it ends."""
    started, announced = time.monotonic(), threading.Event()

    def announce() -> None:
        announced.set()
        _say(f"drivetrain-jittor: importing jittor is taking more than {after:g} s: the first import on a machine "
             f"(or a new jittor install) compiles jittor's C++ core, which takes minutes (~4-6 min on 2 cores); the "
             f"result is cached under {_cache_hint()} and later imports take seconds.")

    timer = threading.Timer(min(after, threading.TIMEOUT_MAX), announce)  # inf: never (Event.wait overflows)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        timer.join()
    if announced.is_set():
        _say(f"drivetrain-jittor: jittor imported in {time.monotonic() - started:.0f} s.")


def import_jittor(notice_after: float = SLOW_IMPORT_NOTICE_S) -> ModuleType:
    """Import jittor the safe way (see the module docstring) and return the module.

    A second call returns the imported module at once. ``notice_after``: seconds before
    the "jittor is compiling" status line (``float('inf')`` for none).
    """
    module = sys.modules.get("jittor")
    if module is not None:
        return module
    prepare_environment()
    python_state, numpy_state = random.getstate(), np.random.get_state()
    handlers = _python_signal_handlers()
    with _slow_import_notice(notice_after):
        import jittor
    random.setstate(python_state)  # jittor reseeds both from the clock at import
    np.random.set_state(numpy_state)
    _restore_signal_handlers(handlers)
    return jittor


_SIGNALS = ("SIGINT", "SIGCHLD")


def _python_signal_handlers() -> dict[int, object]:
    """The handlers python knows for the signals jittor takes over (main thread only: others cannot set them)."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    out = {}
    for name in _SIGNALS:
        number = getattr(signal, name, None)
        if number is not None:
            handler = signal.getsignal(number)
            if handler is not None:  # None: installed outside python, unknown to it: leave jittor's
                out[number] = handler
    return out


def _restore_signal_handlers(handlers: dict[int, object]) -> None:
    for number, handler in handlers.items():
        signal.signal(number, handler)
