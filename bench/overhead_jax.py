"""What does ``Trainer.run()`` cost over a hand-written ``nnx.jit`` loop? (JAX's counterpart of overhead.py)

Both sides train the same flax NNX model from the same initial weights on the same pre-built batches (a list of
``{"x": array, "target": array}`` dicts of jax arrays on the CPU) with ``nnx.Optimizer(model, optax.sgd(lr),
wrt=nnx.Param)``. The hand loop is flax's usual step: ``@nnx.jit def train_step(model, optimizer, batch)`` with
``nnx.value_and_grad`` and ``optimizer.update``, returning the outputs. JAX dispatches asynchronously, so every
measured run ends by waiting for all queued work (both sides alike). The warm-up checks that both sides end with
bit-identical weights. Every optimizer shares one optax transformation, so after the warm-up neither side compiles
(both keep their programs for the process); how often a Trainer run compiles, and what it costs, is printed after.

Workloads (as in overhead.py):

- W1: MLP 32->64->10 (Linear-ReLU-Linear, cross-entropy), batch size 32.
- W2: Linear 8->2 (MSE), batch size 8: so little compute that the per-step overhead shows.

    python bench/overhead_jax.py [--steps N] [--rounds R] [--workload W1|W2|all] [--json PATH]

The rounds, statistics and table are the shared ``_overhead_harness.py``'s. ``nnx.jit`` splits and merges the whole
graph on every call, which costs more than these steps compute, so the Trainer (whose driver splits the model once)
beats it; a third loop, flax's functional-API recipe (split once, one ``jax.jit`` step), is timed too, as the
fastest hand loop to compare with. A measurement, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import flax  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from _overhead_harness import LR, SEED, Framework, TimeMeter, Workload, print_table, run_workload  # noqa: E402
from flax import nnx  # noqa: E402

from drivetrain import Trainer  # noqa: E402


class MLP(nnx.Module):
    """W1: Linear-ReLU-Linear with cross-entropy."""

    def __init__(self, n_in: int = 32, hidden: int = 64, n_out: int = 10) -> None:
        rngs = nnx.Rngs(SEED)
        self.fc1 = nnx.Linear(n_in, hidden, rngs=rngs)
        self.fc2 = nnx.Linear(hidden, n_out, rngs=rngs)

    def __call__(self, x, target):
        logits = self.fc2(nnx.relu(self.fc1(x)))
        return {"loss": optax.softmax_cross_entropy_with_integer_labels(logits, target).mean()}


class Regression(nnx.Module):
    """W2: a single Linear layer with MSE."""

    def __init__(self, n_in: int = 8, n_out: int = 2) -> None:
        self.linear = nnx.Linear(n_in, n_out, rngs=nnx.Rngs(SEED))

    def __call__(self, x, target):
        return {"loss": jnp.mean((self.linear(x) - target) ** 2)}


def w1_batches(steps: int) -> list[dict]:
    rng = np.random.default_rng(SEED)
    return [{"x": jnp.asarray(rng.standard_normal((32, 32)).astype(np.float32)),
             "target": jnp.asarray(rng.integers(0, 10, 32).astype(np.int32))} for _ in range(steps)]


def w2_batches(steps: int) -> list[dict]:
    rng = np.random.default_rng(SEED)
    return [{"x": jnp.asarray(rng.standard_normal((8, 8)).astype(np.float32)),
             "target": jnp.asarray(rng.standard_normal((8, 2)).astype(np.float32))} for _ in range(steps)]


@nnx.jit
def train_step(model, optimizer, batch):
    def loss_fn(model):
        outputs = model(batch["x"], batch["target"])
        return outputs["loss"], outputs

    (_, outputs), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
    optimizer.update(model, grads)
    return outputs


def hand_step(model, optimizer, batch) -> None:
    train_step(model, optimizer, batch)


def same_weights(a, b) -> bool:
    left, right = nnx.state(a, nnx.Param), nnx.state(b, nnx.Param)
    return all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(left), jax.tree.leaves(right), strict=True))


TX = optax.sgd(LR)
"""One optax transformation for every optimizer: its functions are static parts of the optimizer's graph, so a new
``optax.sgd(LR)`` per run would make ``nnx.jit`` (and the driver) compile every run again."""


class SyncedTimeMeter(TimeMeter):
    """The harness's time meter, stopping only once every queued computation has finished."""

    def stop(self, steps: int) -> dict[str, float]:
        for array in jax.live_arrays():
            array.block_until_ready()
        return super().stop(steps)


JAX = Framework(
    name="jax",
    version=f"{jax.__version__} (flax {flax.__version__}, optax {optax.__version__})",
    driver="jax",
    workloads={"W1": Workload("MLP 32-64-10, CE, bs=32", MLP, w1_batches),
               "W2": Workload("Linear 8-2, MSE, bs=8", Regression, w2_batches)},
    copy_model=nnx.clone,
    make_optimizer=lambda model, lr: nnx.Optimizer(model, TX, wrt=nnx.Param),
    hand_step=hand_step,
    prepare_hand=lambda model, optimizer: model.train(),
    same_weights=same_weights,
)


_FUNCTIONAL: dict = {}


def functional_loop(model, optimizer, batches: list[dict], meter) -> dict[str, float]:
    """The fastest loop a JAX user writes by hand (flax's functional API, with flat states): model and optimizer split
    once, their state's leaves threaded through one ``jax.jit`` step that merges them, merged back at the end (the
    step is kept across runs of the same graph, as the other loops keep theirs)."""
    graphdef, state = nnx.split((model, optimizer))
    leaves, treedef = jax.tree.flatten(state)
    step = _FUNCTIONAL.get((graphdef, treedef))
    if step is None:
        @jax.jit
        def step(leaves, batch):
            module, opt = nnx.merge(graphdef, jax.tree.unflatten(treedef, leaves))
            outputs = train_step.__wrapped__(module, opt, batch)  # the same step as the nnx.jit loop's
            return jax.tree.leaves(nnx.state((module, opt))), outputs

        _FUNCTIONAL[graphdef, treedef] = step
    model.train()
    meter.start()
    for batch in batches:
        leaves, _ = step(leaves, batch)
    result = meter.stop(len(batches))
    nnx.update((model, optimizer), jax.tree.unflatten(treedef, leaves))
    return result


def functional_rounds(name: str, steps: int, rounds: int) -> dict:
    """Median µs/step of :func:`functional_loop` over ``rounds`` runs (after a warm-up checking its weights)."""
    spec = JAX.workloads[name]
    initial, batches = spec.make_model(), spec.make_batches(steps)
    meter = SyncedTimeMeter()
    warm = [nnx.clone(initial) for _ in range(2)]
    functional_loop(warm[0], JAX.make_optimizer(warm[0], LR), batches[:50], meter)
    hand_step_model, optimizer = warm[1], JAX.make_optimizer(warm[1], LR)
    for batch in batches[:50]:
        hand_step(hand_step_model, optimizer, batch)
    if not same_weights(warm[0], hand_step_model):
        raise SystemExit(f"{name}: the functional loop and the nnx.jit loop ended with different weights.")
    cpu = []
    for _ in range(rounds):
        model = nnx.clone(initial)
        cpu.append(functional_loop(model, JAX.make_optimizer(model, LR), batches, meter)["cpu"])
    return {"workload": name, "cpu": statistics.median(cpu)}


def compilations(name: str, steps: int) -> dict:
    """One Trainer run over ``steps`` batches and a last shorter one: how often each program compiled, and the
    seconds of the first step (compile included) against a later one."""
    spec = JAX.workloads[name]
    model = spec.make_model()
    batches = spec.make_batches(steps + 1)
    batches[-1] = {k: v[: len(v) // 2] for k, v in batches[-1].items()}  # the last batch of an epoch, shorter
    times: list[float] = []
    trainer = Trainer(model, batches, JAX.make_optimizer(model, LR), driver="jax", n_epochs=2, progress_bar=None)
    trainer.add_callback_fn("on_train_batch_end", lambda t: times.append(time.perf_counter()))
    start = time.perf_counter()
    trainer.run(num_eval_sanity_batch=0)
    return {"workload": name, "traces": dict(trainer.driver.traces), "batches": 2 * len(batches),
            "first_step_s": times[0] - start, "later_step_s": times[2] - times[1]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2000, help="batches per run (default 2000)")
    parser.add_argument("--rounds", type=int, default=9, help="measured rounds per side (default 9)")
    parser.add_argument("--workload", choices=[*JAX.workloads, "all"], default="all")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    args = parser.parse_args(argv)
    names = list(JAX.workloads) if args.workload == "all" else [args.workload]
    print(f"jax {JAX.version}, python {platform.python_version()}, {os.cpu_count()} CPUs, {args.steps} steps x "
          f"{args.rounds} rounds")
    compiled = [compilations(name, 50) for name in names]  # first, while nothing is compiled yet
    meter = SyncedTimeMeter()
    results = [run_workload(JAX, name, args.steps, args.rounds, False, meter) for name in names]
    print_table(results, meter)
    functional = [functional_rounds(name, args.steps, args.rounds) for name in names]
    for row, result in zip(functional, results, strict=True):
        trainer = result["cpu"]["median"]["trainer"]
        print(f"  {row['workload']} against the functional loop (nnx.split once, flat leaves, one jax.jit step): "
              f"{row['cpu']:.1f} µs/step, trainer/functional {trainer / row['cpu']:.3f}")
    for row in compiled:
        print(f"{row['workload']} (fresh process): {row['batches']} batches (2 epochs of 50 and a shorter last "
              f"one) compiled {row['traces']}; first step {row['first_step_s'] * 1e3:.0f} ms (compiling), a later "
              f"one {row['later_step_s'] * 1e6:.0f} µs")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"jax": JAX.version, "results": results, "functional": functional,
                       "compilations": compiled}, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
