"""oneflow's random generators, captured and restored exactly so a resumed run draws the same numbers.

Three kinds of generators matter in oneflow 0.9:

- the default CPU generator: ``oneflow.rand``, functional dropout, initialisers, samplers;
- one default generator per CUDA device, when CUDA is available;
- a generator owned by each module that has one: ``nn.Dropout`` builds its own
  (``oneflow.Generator()``, device "auto") seeded with a fixed constant that
  ``oneflow.manual_seed`` never reaches. An "auto" generator's state cannot be saved
  (its ``get_state`` is 32 bytes, not the engine), so the driver gives each such module a
  generator of its device, seeded the same, when it is built.

A CPU generator is a ``std::mt19937`` whose ``get_state`` loses the read position (see
:mod:`._mt19937`). A capture therefore reads the words, draws three raw outputs to find
the position among the tempered words, and puts the engine back where it was: the
capture changes nothing, and a restore lands on exactly the same next number. Each
capture or restore waits for oneflow's queued work (a checkpoint, an evaluation); the
training steps themselves are untouched. CUDA generators are saved with their own
``get_state`` (a Philox seed and offset).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import oneflow as flow

from drivetrain.backend import DriverError, check_rng_state_keys, rng_state_list

from ._mt19937 import N, temper, twist, untwist

_KEYS = ("cpu", "cuda", "modules")
_GENERATOR = type(flow.default_generator)  # oneflow.Generator is a factory function, not the class
_PROBE = 3  # raw outputs drawn to find the engine's position (a false match has odds ~2**-96)


def module_generators(model: flow.nn.Module | None) -> Iterator[tuple[str, Any]]:
    """``(module name, generator)`` for every module holding its own generator (Dropout and kin)."""
    if model is None:
        return
    for name, module in model.named_modules():
        generator = getattr(module, "generator", None)
        if isinstance(generator, _GENERATOR):
            yield name, generator


def give_modules_device_generators(model: flow.nn.Module, device_type: str) -> None:
    """Replace each module's "auto" generator by one of ``device_type`` with the same seed (whose state saves)."""
    for _, module in model.named_modules():
        generator = getattr(module, "generator", None)
        if isinstance(generator, _GENERATOR) and str(generator.device).startswith("auto"):
            replacement = flow.Generator(device_type)
            replacement.manual_seed(generator.initial_seed())
            module.generator = replacement


def _kind(generator: Any) -> str:
    return str(generator.device).split(":")[0]


def _cuda_generators() -> list[Any]:
    if not flow.cuda.is_available():
        return []
    return [flow._oneflow_internal.default_generator(f"cuda:{i}") for i in range(flow.cuda.device_count())]


# ------------------------------------------------------------------- one generator
def _raw_outputs(generator: Any, count: int) -> flow.Tensor:
    """``count`` raw 32-bit engine outputs (``randint`` over the full 32-bit range takes one word each)."""
    return flow.randint(0, 2**32, (count,), dtype=flow.int64, generator=generator)


def _set_words(generator: Any, words: np.ndarray, seed: int) -> None:
    payload = np.concatenate([np.asarray(words, dtype=np.uint64).astype(np.int64), np.array([seed], np.int64)])
    generator.set_state(flow.tensor(payload.view(np.uint8)))


def _place(generator: Any, words: np.ndarray, position: int, seed: int) -> None:
    """Put a CPU engine at ``words``, about to output ``temper(words[position])`` (``N``: about to twist)."""
    if position == N:
        _set_words(generator, words, seed)
        return
    _set_words(generator, untwist(words), seed)  # the next draw twists these into ``words``, at position 0
    if position:
        _raw_outputs(generator, position)


def capture(generator: Any) -> dict[str, Any]:
    """The generator's exact state; it is left exactly where it was."""
    if _kind(generator) != "cpu":
        return {"state": generator.get_state()}
    saved = np.frombuffer(generator.get_state().numpy().tobytes(), dtype=np.int64)
    words, seed = saved[:N].astype(np.uint64), int(saved[N])
    probe = _raw_outputs(generator, _PROBE).numpy().astype(np.uint64)
    outputs = np.concatenate([temper(words), temper(twist(words))])
    positions = [j for j in range(N + 1) if np.array_equal(outputs[j:j + _PROBE], probe)]
    if len(positions) != 1:
        raise DriverError(
            f"rng_state: cannot locate the position of oneflow {flow.__version__}'s CPU generator ({len(positions)} "
            "candidates); this oneflow's generator is not the std::mt19937 the driver was written for."
        )
    _place(generator, words, positions[0], seed)
    return {"words": flow.tensor(words.astype(np.int64)), "position": positions[0], "seed": seed}


def restore(generator: Any, state: Any, where: str) -> None:
    """Put ``generator`` back to a state :func:`capture` returned."""
    if not isinstance(state, Mapping):
        raise DriverError(f"load_rng_state: state[{where!r}] is a {type(state).__name__}, not a captured generator.")
    if _kind(generator) != "cpu" or "state" in state:
        if "state" not in state or _kind(generator) == "cpu":
            raise DriverError(
                f"load_rng_state: state[{where!r}] was saved from a generator of another device than this "
                f"{_kind(generator)} one; load it where the model runs on the same kind of device."
            )
        generator.set_state(_uint8(state["state"], where))
        return
    try:
        words = np.asarray(_numpy(state["words"]), dtype=np.int64).astype(np.uint64)
        position, seed = int(state["position"]), int(state["seed"])
    except (KeyError, TypeError, ValueError) as exc:
        raise DriverError(
            f"load_rng_state: state[{where!r}] lacks words/position/seed ({exc!r}); it was not written by this "
            "driver's rng_state()."
        ) from exc
    if words.shape != (N,) or not 0 <= position <= N:
        raise DriverError(
            f"load_rng_state: state[{where!r}] has {words.size} words and position {position}; a oneflow CPU "
            f"generator has {N} words and a position in 0..{N}."
        )
    _place(generator, words, position, seed)


def _numpy(value: Any) -> Any:
    return value.numpy() if isinstance(value, flow.Tensor) else value


def _uint8(value: Any, where: str) -> flow.Tensor:
    if isinstance(value, np.ndarray):
        value = flow.tensor(np.ascontiguousarray(value))
    if not isinstance(value, flow.Tensor) or value.dtype != flow.uint8:
        raise DriverError(f"load_rng_state: state[{where!r}] is not a uint8 generator state.")
    return value.detach().cpu()


# --------------------------------------------------------------- every generator
def rng_state(model: flow.nn.Module | None) -> dict[str, Any]:
    """``{"cpu": ..., "modules": {name: ...}}`` plus ``"cuda": [...]`` where CUDA is available."""
    state: dict[str, Any] = {
        "cpu": capture(flow.default_generator),
        "modules": {name: capture(generator) for name, generator in module_generators(model)},
    }
    cuda = _cuda_generators()
    if cuda:
        state["cuda"] = [capture(generator) for generator in cuda]
    return state


def load_rng_state(state: Mapping[str, Any], model: flow.nn.Module | None) -> None:
    """Restore :func:`rng_state`; a module generator absent from the state keeps its current state."""
    check_rng_state_keys(state, _KEYS, "oneflow")
    modules = state.get("modules") or {}
    if not isinstance(modules, Mapping):
        raise DriverError(f"load_rng_state: state['modules'] is a {type(modules).__name__}; expected a dict.")
    owned = dict(module_generators(model))
    strangers = sorted(set(modules) - set(owned))
    if strangers:
        raise DriverError(
            f"load_rng_state: the state holds generators of module(s) {strangers[:10]} that this model does not "
            "have (or that hold no generator); it was saved from a different model."
        )
    cuda = rng_state_list(state.get("cuda") or [], "cuda")
    restore(flow.default_generator, state["cpu"], "cpu")
    for name, value in modules.items():
        restore(owned[name], value, f"modules/{name}")
    for index, (generator, value) in enumerate(zip(_cuda_generators(), cuda, strict=False)):  # the devices here
        restore(generator, value, f"cuda/{index}")


def seed_all(model: flow.nn.Module | None, seed: int) -> None:
    """Seed oneflow's default generators with ``seed`` and each module's with a seed derived from its name."""
    flow.manual_seed(seed)
    for name, generator in module_generators(model):
        entropy = [seed, *name.encode("utf-8")]
        generator.manual_seed(int(np.random.SeedSequence(entropy).generate_state(1, np.uint64)[0]) >> 2)
