"""jittor's random generator: seeding, and its state captured and restored for sample-exact resume.

jittor draws every CPU random number (``jt.random``, ``jt.randn``, dropout) from one
C++ ``std::default_random_engine`` (``minstd_rand0``: a linear congruential generator
whose whole state is one integer), reseeded by ``jt.set_seed``. Python gets the seed
back (``jt.get_seed``) but not the engine's position, so this module reads and writes
that integer in jittor's core library directly (the exported symbol ``jittor::eng``;
``std::unique_ptr`` to the engine). Before relying on it, :func:`_engine` checks on the
live library that writing a state really replays the same draws, and refuses with a
clear error otherwise (e.g. another jittor version laid out differently).

Random operations run lazily, when their result is needed: the state is read after
``jt.sync_all()``, so draws already requested count as done. CUDA random numbers come
from cuRAND generators jittor does not expose; on a GPU the restored state covers the
CPU engine and the seed, and the cuRAND streams restart from that seed.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from drivetrain.backend import DriverError, check_rng_state_keys

_ENGINE_SYMBOL = "_ZN6jittor3engE"  # jittor::eng, a std::unique_ptr<std::default_random_engine>
_KEYS = ("seed", "engine")
_MODULUS = 2147483647  # minstd_rand0's modulus: a state is in [1, _MODULUS)
_engine_address: int | None = None


def _jittor() -> Any:
    return sys.modules["jittor"]


def seed_generator(seed: int) -> None:
    """``jt.set_seed`` for any non-negative int (jittor takes a C int: larger seeds are folded in)."""
    _jittor().set_seed(int(seed) % 2**31)


def _core_library_path() -> str:
    core = getattr(_jittor(), "core", None) or sys.modules.get("jittor_core")
    path = getattr(core, "__file__", None)
    if not path or not os.path.exists(path):
        raise DriverError("cannot locate jittor's core library (jittor_core), so its random state cannot be saved.")
    return path


def _state_word(holder: int) -> ctypes.c_uint64:
    """The engine's state word; ``holder`` is the unique_ptr's address (``jt.set_seed`` allocates a new engine)."""
    engine = ctypes.c_void_p.from_address(holder).value
    if not engine:
        raise DriverError("jittor's random engine is not initialised; import jittor fully before saving its state.")
    return ctypes.c_uint64.from_address(engine)


def _read(holder: int) -> int:
    return _state_word(holder).value


def _write(holder: int, value: int) -> None:
    _state_word(holder).value = value


def _engine() -> int:
    """Address of the pointer to the engine, checked once on the live library."""
    global _engine_address
    if _engine_address is not None:
        return _engine_address
    jt = _jittor()
    try:
        library = ctypes.CDLL(_core_library_path(), mode=os.RTLD_NOLOAD | os.RTLD_NOW)
        pointer = ctypes.addressof(ctypes.c_void_p.in_dll(library, _ENGINE_SYMBOL))
    except (OSError, ValueError) as exc:
        raise DriverError(
            f"jittor {jt.__version__}: its random engine is not where drivetrain-jittor expects it ({exc}); the "
            "random state cannot be checkpointed. drivetrain-jittor is tested with jittor 1.3.11.0."
        ) from exc
    saved_seed = jt.get_seed()
    jt.sync_all()
    saved = _read(pointer)
    jt.set_seed(12345)
    ok = _read(pointer) == 12345
    if ok:
        _write(pointer, 777)
        first = jt.random((4,)).numpy()
        _write(pointer, 777)
        ok = np.array_equal(first, jt.random((4,)).numpy())
    jt.set_seed(saved_seed)
    _write(pointer, saved)
    if not ok:
        raise DriverError(
            f"jittor {jt.__version__}: writing its random engine's state did not replay the same numbers, so "
            "the random state cannot be checkpointed exactly. drivetrain-jittor is tested with jittor 1.3.11.0."
        )
    _engine_address = pointer
    return pointer


def rng_state() -> dict[str, Any]:
    """``{"seed": int, "engine": int}``: jittor's seed and the CPU engine's position after every pending draw."""
    jt = _jittor()
    address = _engine()
    jt.sync_all()
    return {"seed": int(jt.get_seed()), "engine": int(_read(address))}


def load_rng_state(state: Mapping[str, Any]) -> None:
    """Restore :func:`rng_state`: reseed (cuRAND restarts from the seed) and put the engine back."""
    check_rng_state_keys(state, _KEYS, "jittor", required=_KEYS)
    seed, engine = state["seed"], state["engine"]
    for key, value in (("seed", seed), ("engine", engine)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise DriverError(f"load_rng_state: state[{key!r}]={value!r} must be an int.")
    if not 0 < int(engine) < _MODULUS:
        raise DriverError(f"load_rng_state: state['engine']={engine!r} is not a state of jittor's engine.")
    jt = _jittor()
    address = _engine()
    jt.sync_all()  # draws requested before the restore take their numbers from the old position
    jt.set_seed(int(seed))
    _write(address, int(engine))
