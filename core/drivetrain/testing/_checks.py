"""The driver contract (docs/backend-author-guide.md) as checks any backend can run through its kit.

Each check belongs to a contract group and states its rule; a failure raises
:class:`ContractViolation` naming the group, the rule and what the driver returned.
Checks use the public API and the driver's own methods only, so the same checks run
for every backend, in pytest (:class:`~drivetrain.testing.ContractSuite`) or from
``drivetrain backends --check NAME``.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import (
    Accuracy,
    CallbackError,
    CheckpointCallback,
    Driver,
    DriverError,
    Evaluator,
    Event,
    Trainer,
    available_drivers,
)
from .._format import MODEL_PREFIX, ShardSource
from ..backend import ArgumentNames, ModelStep, create_driver, resolve_spec
from ._kit import CLASSES, BackendKit


class ContractViolation(AssertionError):
    """A driver broke a rule of the contract; the message names the group, the rule and what it returned."""


@dataclass(frozen=True)
class Check:
    group: str
    name: str
    rule: str
    run: Callable[[BackendKit], None]

    def __call__(self, kit: BackendKit) -> None:
        try:
            self.run(kit)
        except ContractViolation as exc:
            raise ContractViolation(f"[{self.group}] {self.rule}\n  broken: {exc}") from None
        except Exception as exc:
            raise ContractViolation(
                f"[{self.group}] {self.rule}\n  the driver raised {type(exc).__name__}: {exc}"
            ) from exc


CHECKS: list[Check] = []
GROUPS = ("discovery", "process", "model", "optimisation", "data", "state", "resume", "end-to-end")


def check(group: str, rule: str) -> Callable[[Callable[[BackendKit], None]], Callable[[BackendKit], None]]:
    assert group in GROUPS, group

    def register(fn: Callable[[BackendKit], None]) -> Callable[[BackendKit], None]:
        CHECKS.append(Check(group, fn.__name__, rule, fn))
        return fn

    return register


def expect(condition: Any, message: str) -> None:
    if not condition:
        raise ContractViolation(message)


@contextlib.contextmanager
def expect_raises(kind: type[BaseException], mentions: str, what: str) -> Iterator[None]:
    try:
        yield
    except kind as exc:
        expect(mentions.lower() in str(exc).lower(), f"{what} raised {type(exc).__name__}({exc}) that does not "
               f"mention {mentions!r}")
    else:
        raise ContractViolation(f"{what} raised nothing; expected {kind.__name__} mentioning {mentions!r}")


def build(kit: BackendKit, lr: float = 0.1, **options: Any) -> Driver:
    model = kit.make_model()
    driver = create_driver(kit.driver, model, "cpu", **options)
    driver.set_optimizers(kit.make_optimizer(driver.unwrap_model(), lr))
    driver.setup()
    return driver


def params(driver: Driver) -> dict[str, np.ndarray]:
    return {k: np.array(driver.tensor_to_numpy(v), copy=True) for k, v in driver.model_state().items()}


def train_one(driver: Driver, batch: Any, cycle_size: int = 1, sync: bool = True) -> None:
    """Add one batch's gradients as the Trainer does, through ``forward_backward`` (``cycle_size``: the batches of
    the accumulation cycle; ``sync``: the cycle's last batch), so a driver that computes the loss and its gradients
    in one call (``Capabilities(separate_backward=False)``, JAX) is checked like the others."""
    driver.set_model_mode("train")
    step = ModelStep(driver, None, "train_step", None, None, ArgumentNames(), "train function")
    driver.forward_backward(batch, step, cycle_size=cycle_size, sync=sync)


def expect_same(got: dict[str, np.ndarray], want: dict[str, np.ndarray], what: str, rtol: float = 0.0) -> None:
    expect(set(got) == set(want), f"{what}: parameter names {sorted(got)} differ from {sorted(want)}")
    for key in want:
        if rtol:
            close = np.allclose(got[key], want[key], rtol=rtol, atol=rtol / 10)
        else:
            close = np.array_equal(got[key], want[key])
        worst = float(np.max(np.abs(np.asarray(got[key], np.float64) - want[key]))) if got[key].size else 0.0
        expect(close, f"{what}: {key!r} differs (max abs difference {worst:.3g})")


# ------------------------------------------------------------------ discovery
@check("discovery", "the DriverSpec names the kit's framework and driver='auto' claims the backend's models (unless "
       "it claims none: an engine on another backend, chosen by name)")
def spec_and_auto(kit: BackendKit) -> None:
    spec = available_drivers()[kit.driver]
    expect(spec.framework == kit.framework, f"DriverSpec.framework={spec.framework!r}, kit says {kit.framework!r}")
    model = kit.make_model()
    chosen = kit.driver  # an engine built on another backend claims no model: it is chosen by name
    if spec.model_modules or spec.detect is not None:
        claimed = resolve_spec("auto", model).name
        expect(claimed == kit.driver, f"driver='auto' chose {claimed!r} for a {type(model).__qualname__}")
        chosen = "auto"
    driver = create_driver(chosen, model, "cpu")
    expect(isinstance(driver, Driver), f"the factory returned {type(driver)!r}, not a drivetrain.Driver")
    expect(driver.name == kit.driver, f"Driver.name={driver.name!r} differs from the spec name {kit.driver!r}")


# -------------------------------------------------------------------- process
@check("process", "a single-process driver is rank 0 of 1 and its collectives are identities")
def single_process_identity(kit: BackendKit) -> None:
    driver = build(kit)
    identity = (driver.rank, driver.local_rank, driver.world_size)
    expect(identity == (0, 0, 1), f"(rank, local_rank, world_size) = {identity}")
    expect(driver.is_global_zero and not driver.is_distributed(),
           f"is_global_zero={driver.is_global_zero}, is_distributed()={driver.is_distributed()}")
    driver.barrier()
    got = driver.broadcast_object({"a": 1})
    expect(got == {"a": 1}, f"broadcast_object({{'a': 1}}) returned {got!r}")
    gathered = driver.all_gather_object(5)
    expect(gathered == [5], f"all_gather_object(5) returned {gathered!r}")
    reduced = driver.all_reduce(np.array([1.0, 2.0]), "sum")
    expect(np.array_equal(reduced, [1.0, 2.0]), f"all_reduce([1, 2], 'sum') returned {reduced!r}")


# ---------------------------------------------------------------------- model
@check("model", "model_call matches batch keys to forward's parameters and returns its outputs")
def model_call_matches_batch_keys(kit: BackendKit) -> None:
    driver = build(kit)
    fn, sig = driver.get_model_call_fn(None)
    batch = driver.move_data_to_device(kit.batches()[0])
    out = driver.model_call(batch, fn, sig)
    loss = driver.tensor_to_numpy(out["loss"])
    expect(isinstance(loss, np.ndarray) and loss.shape == (), f"tensor_to_numpy(loss) gave {loss!r}, not a 0-d array")
    expect(np.isfinite(loss), f"the loss is {loss}")
    pred = driver.tensor_to_numpy(out["pred"])
    expect(pred.shape == (10, CLASSES), f"tensor_to_numpy(pred).shape={pred.shape}, expected (10, {CLASSES})")


@check("model", "no_grad, auto_cast and no_sync return context managers; set_model_mode takes 'train'/'eval'")
def contexts_are_usable(kit: BackendKit) -> None:
    driver = build(kit)
    for name in ("no_grad", "auto_cast", "no_sync"):
        ctx = getattr(driver, name)()
        expect(hasattr(ctx, "__enter__") and hasattr(ctx, "__exit__"), f"Driver.{name}() returned {ctx!r}")
        with ctx:
            pass
    driver.set_model_mode("eval")
    driver.set_model_mode("train")


@check("model", "unwrap_model returns the very model the user passed")
def unwrap_model_is_the_users_model(kit: BackendKit) -> None:
    model = kit.make_model()
    driver = create_driver(kit.driver, model, "cpu")
    expect(driver.unwrap_model() is model, f"unwrap_model() returned {driver.unwrap_model()!r}")


# --------------------------------------------------------------- optimisation
@check("optimisation", "forward_backward + step change the parameters; zero_grad clears the gradients")
def backward_step_zero_grad(kit: BackendKit) -> None:
    driver = build(kit)
    before = params(driver)
    train_one(driver, driver.move_data_to_device(kit.batches()[0]))
    driver.step()
    after = params(driver)
    expect(any(not np.array_equal(before[k], after[k]) for k in before), "forward_backward + step changed no parameter")
    driver.zero_grad()
    driver.step()
    expect_same(params(driver), after, "step() right after zero_grad() moved the parameters")


@check("optimisation", "gradients accumulate: a cycle of two batches (cycle_size=2) then step equals one batch then "
                        "step")
def divided_losses_accumulate(kit: BackendKit) -> None:
    batch = kit.batches()[0]
    once = build(kit)
    train_one(once, once.move_data_to_device(batch))
    once.step()
    twice = build(kit)
    moved = twice.move_data_to_device(batch)
    train_one(twice, moved, cycle_size=2, sync=False)
    train_one(twice, moved, cycle_size=2)
    twice.step()
    expect_same(params(twice), params(once), "accumulated update vs single update", rtol=1e-5)


@check("optimisation", "grad_clip=c (norm) bounds the update of an lr=1 SGD step by c; grad_norm is the norm before")
def grad_clip_bounds_the_update(kit: BackendKit) -> None:
    batch = kit.batches()[0]
    free = build(kit, lr=1.0)
    clipped = build(kit, lr=1.0, grad_clip=1e-3)
    start = params(free)
    for driver in (free, clipped):
        train_one(driver, driver.move_data_to_device(batch))
        driver.step()
    moved_free = sum(float(np.sum((params(free)[k] - start[k]) ** 2)) for k in start) ** 0.5
    moved_clip = sum(float(np.sum((params(clipped)[k] - start[k]) ** 2)) for k in start) ** 0.5
    expect(moved_clip <= 1e-3 * 1.01, f"with grad_clip=1e-3 and lr=1 the step norm was {moved_clip}")
    expect(moved_free > moved_clip, f"unclipped step norm {moved_free} is not above the clipped {moved_clip}")
    # an lr=1 SGD step moves the parameters by the gradient: its norm is the norm clipping saw
    norm = clipped.grad_norm
    expect(norm is not None, "after a step that clipped by norm, driver.grad_norm is None; set it in step()")
    norm = float(np.asarray(norm if isinstance(norm, (int, float)) else clipped.tensor_to_numpy(norm)).reshape(-1)[0])
    expect(abs(norm - moved_free) <= 1e-4 * moved_free,
           f"driver.grad_norm {norm} is not the gradient norm before clipping ({moved_free})")
    expect(free.grad_norm is None, f"driver.grad_norm is {free.grad_norm!r} after a step without clipping")


@check("optimisation", "get_lrs reads the optimizer's rate; the rate set_lrs sets is read back and used by step")
def learning_rates_are_read_set_and_used(kit: BackendKit) -> None:
    batch = kit.batches()[0]
    driver = build(kit, lr=0.1)
    lrs = driver.get_lrs()
    shaped = isinstance(lrs, list) and len(lrs) == 1 and isinstance(lrs[0], list) and len(lrs[0]) == 1
    expect(shaped and isinstance(lrs[0][0], float), f"get_lrs() of one SGD optimizer returned {lrs!r}, not [[lr]]")
    expect(abs(lrs[0][0] - 0.1) <= 1e-7, f"get_lrs() returned {lrs!r} for an optimizer built with lr=0.1")
    driver.set_lrs([[0.0]])
    expect(driver.get_lrs() == [[0.0]], f"get_lrs() after set_lrs([[0.0]]) returned {driver.get_lrs()!r}")
    before = params(driver)
    train_one(driver, driver.move_data_to_device(batch))
    driver.step()
    expect_same(params(driver), before, "an SGD step after set_lrs([[0.0]]) moved the parameters")

    driver = build(kit, lr=0.1)
    driver.set_lrs([[0.05]])
    got = driver.get_lrs()
    expect(abs(got[0][0] - 0.05) <= 1e-7, f"get_lrs() after set_lrs([[0.05]]) returned {got!r}")
    train_one(driver, driver.move_data_to_device(batch))
    driver.step()
    built = build(kit, lr=0.05)
    train_one(built, built.move_data_to_device(batch))
    built.step()
    expect_same(params(driver), params(built), "a step after set_lrs([[0.05]]) vs one with an lr=0.05 optimizer",
                rtol=1e-6)
    with expect_raises(DriverError, "lrs", "set_lrs([[0.1], [0.1]]) for one optimizer"):
        driver.set_lrs([[0.1], [0.1]])


@check("optimisation", "set_optimizers refuses a non-optimizer with a DriverError naming optimizers=")
def set_optimizers_rejects_a_foreign_object(kit: BackendKit) -> None:
    driver = create_driver(kit.driver, kit.make_model(), "cpu")
    with expect_raises(DriverError, "optimizers=", "set_optimizers(object())"):
        driver.set_optimizers(object())


# ----------------------------------------------------------------------- data
@check("data", "move_data_to_device keeps nested dict/list/tuple structure and passes non-tensors through")
def move_data_keeps_nested_structure(kit: BackendKit) -> None:
    driver = build(kit)
    batch = kit.batches()[0]
    nested = {"a": [batch["x"], (batch["target"], "label")], "n": 3}
    moved = driver.move_data_to_device(nested)
    shape_ok = isinstance(moved, dict) and isinstance(moved["a"], list) and isinstance(moved["a"][1], tuple)
    expect(shape_ok, f"the structure changed: {type(moved).__name__} {moved!r:.200}")
    expect(moved["n"] == 3 and moved["a"][1][1] == "label", f"non-tensors changed: {moved!r:.200}")
    same = np.array_equal(driver.tensor_to_numpy(moved["a"][0]), driver.tensor_to_numpy(batch["x"]))
    expect(same, "a moved tensor holds other values")


@check("data", "check_dataloader_legality accepts an iterable of batches and names the argument when refusing")
def check_dataloader_legality_names_the_argument(kit: BackendKit) -> None:
    driver = build(kit)
    driver.check_dataloader_legality(kit.batches(), argument="train_dataloader")
    with expect_raises(DriverError, "train_dataloader=", "check_dataloader_legality(42)"):
        driver.check_dataloader_legality(42, argument="train_dataloader")


# ---------------------------------------------------------------------- state
@check("state", "save_tensors writes a safetensors file of every model tensor; load_model_state restores them")
def state_round_trip_without_pickle(kit: BackendKit) -> None:
    driver = build(kit)
    saved = params(driver)
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "state.safetensors")
        driver.save_tensors(driver.model_state(), path)
        with open(path, "rb") as f:
            raw = f.read()
        (header_len,) = struct.unpack("<Q", raw[:8])
        header = json.loads(raw[8:8 + header_len])
        names = set(header) - {"__metadata__"}
        expect(names == set(saved), f"the file holds {sorted(names)}, the model state {sorted(saved)}")
        train_one(driver, driver.move_data_to_device(kit.batches()[0]))
        driver.step()
        driver.load_model_state(driver.load_tensors(path))
    expect_same(params(driver), saved, "after load_model_state")


@check("state", "module_classes gives class names per module path, covering every tensor's module when the "
                "DriverSpec's weight_layout has rules scoped to module classes")
def module_classes_cover_the_layout_rules(kit: BackendKit) -> None:
    driver = build(kit)
    classes = driver.module_classes()
    expect(isinstance(classes, dict) and all(isinstance(path, str) and isinstance(names, tuple)
                                             and all(isinstance(n, str) for n in names)
                                             for path, names in classes.items()),
           f"module_classes() returned {classes!r}; it must map module paths to tuples of class names")
    if any(rule.modules for rule in available_drivers()[kit.driver].weight_layout.rules):
        owners = {name.rpartition(".")[0] for name in driver.model_state()}
        expect(owners <= set(classes), f"module_classes() lacks the module(s) {sorted(owners - set(classes))}, "
                                       "which the weight layout's class-scoped rules need")


@check("state", "load_model_state refuses unknown or missing names with an error saying which")
def load_model_state_with_wrong_names(kit: BackendKit) -> None:
    driver = build(kit)
    some_tensor = next(iter(driver.model_state().values()))
    try:
        driver.load_model_state({"not_a_parameter": some_tensor})
    except Exception as exc:  # the contract asks for a clear message, not a particular class
        text = str(exc).lower()
        expect(any(word in text for word in ("key", "name", "missing", "unexpected", "not_a_parameter")),
               f"the error does not say which names are wrong: {type(exc).__name__}({exc})")
    else:
        raise ContractViolation("load_model_state({'not_a_parameter': ...}) raised nothing")


@check("state", "gradient_state captures pending gradients; load_gradient_state puts them back exactly")
def gradient_state_round_trip(kit: BackendKit) -> None:
    batch = kit.batches()[0]
    source = build(kit)
    train_one(source, source.move_data_to_device(batch))
    grads = source.gradient_state()
    expect(isinstance(grads, dict) and grads, f"gradient_state() after backward returned {grads!r:.200}")
    source.step()
    target = build(kit)
    target.load_gradient_state(grads)
    target.step()
    expect_same(params(target), params(source), "a step after load_gradient_state vs the original step")


@check("state", "seed() makes the framework's draws repeatable; load_rng_state(rng_state()) rewinds them")
def rng_state_round_trip(kit: BackendKit) -> None:
    driver = build(kit)
    if kit.random is None:
        raise ContractViolation("the kit has no random= (a function drawing one float from the framework's "
                                "global generator), so the RNG rules cannot be checked; add it to the kit")
    driver.seed(1234)
    seeded = kit.random()
    driver.seed(1234)
    again = kit.random()
    expect(seeded == again, f"two draws after seed(1234) differ: {seeded} vs {again}")
    state = driver.rng_state()
    first = [kit.random() for _ in range(3)]
    driver.load_rng_state(state)
    rewound = [kit.random() for _ in range(3)]
    expect(first == rewound, f"draws after load_rng_state {rewound} differ from those after rng_state {first}")


@check("state", "optimizer_states round-trips through load_optimizer_states")
def optimizer_states_round_trip(kit: BackendKit) -> None:
    driver = build(kit)
    train_one(driver, driver.move_data_to_device(kit.batches()[0]))
    driver.step()
    states = driver.optimizer_states()
    expect(isinstance(states, list) and len(states) == 1, f"optimizer_states() returned {states!r:.200}")
    other = build(kit)
    other.load_optimizer_states(states)


@check("state", "shards_state / reads_state_shards are declared; a driver that does not shard says so in "
               "state_shards(); one that reads shards rebuilds every tensor from pieces two writers split by rows")
def sharded_state_declared_and_read(kit: BackendKit) -> None:
    driver = build(kit)
    declared = (driver.shards_state, driver.reads_state_shards)
    expect(all(isinstance(flag, bool) for flag in declared), f"(shards_state, reads_state_shards) = {declared!r}")
    if not driver.shards_state:
        with expect_raises(DriverError, "does not shard", "state_shards() of a driver with shards_state=False"):
            driver.state_shards(optimizers=True)
    if not driver.reads_state_shards:
        return
    saved = params(driver)
    with tempfile.TemporaryDirectory() as folder:
        source = _two_writer_checkpoint(driver, folder)
        train_one(driver, driver.move_data_to_device(kit.batches()[0]))
        driver.step()
        driver.load_state_shards(source, optimizers=False)
    expect_same(params(driver), saved, "after load_state_shards of the model split between two writers")


def _two_writer_checkpoint(driver: Driver, folder: str) -> ShardSource:
    """The driver's model state as a sharded checkpoint two ranks wrote: each tensor's first rows in one
    file, the rest in the other (a tensor of fewer than two rows whole in the first)."""
    files: list[dict[str, Any]] = [{}, {}]
    layout: dict[str, Any] = {}
    for name, tensor in driver.model_state().items():
        key, shape = MODEL_PREFIX + name, list(driver.tensor_to_numpy(tensor).shape)
        cut = shape[0] // 2 if shape and shape[0] > 1 else 0
        pieces = [(tensor[:cut], 0, cut), (tensor[cut:], cut, shape[0] - cut)] if cut else [(tensor, 0, None)]
        chunks = []
        for index, (piece, begin, rows) in enumerate(pieces):
            files[index][key] = piece
            chunks.append({"file": f"writer{index}.safetensors", "offsets": [begin] + [0] * (len(shape) - 1)
                           if shape else [], "sizes": shape if rows is None else [rows, *shape[1:]]})
        layout[key] = {"shape": shape, "chunks": chunks}
    for index, tensors in enumerate(files):
        path = os.path.join(folder, f"writer{index}.safetensors")
        driver.save_tensors(tensors, path)
        with open(path, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
        for key in tensors:
            layout[key]["dtype"] = header[key]["dtype"]
    return ShardSource(folder, layout, None, 2)


# --------------------------------------------------------------------- resume
@check("resume", "a run stopped after an epoch and resumed from its checkpoint ends bit-identical to an unbroken run")
def exact_resume_through_the_trainer(kit: BackendKit) -> None:
    def trainer(callbacks: list[Any] | None = None) -> Trainer:
        model = kit.make_model()
        return Trainer(model, kit.batches(n=80, batch_size=8), kit.make_optimizer(model, 0.3), driver=kit.driver,
                       device="cpu", n_epochs=2, accumulation_steps=2, progress_bar=None, callbacks=callbacks)

    reference = trainer()
    reference.run()
    with tempfile.TemporaryDirectory() as folder:
        first = trainer([CheckpointCallback(folder, every_n_batches=5, save_last=False)])

        def stop(t: Trainer) -> None:  # after the checkpoint at the end of epoch 0 (batch 10)
            if t.global_forward_batches == 13:
                raise RuntimeError("stopped on purpose")

        first.add_callback_fn(Event.on_train_batch_end(), stop)
        try:
            first.run(catch_KeyboardInterrupt=False)
        except (CallbackError, RuntimeError):
            pass
        resumed = trainer([CheckpointCallback(folder, every_n_batches=5, save_last=False)])
        resumed.run(resume_from=folder)
    expect(resumed.global_forward_batches == reference.global_forward_batches,
           f"the resumed run ended at batch {resumed.global_forward_batches}, "
           f"the unbroken one at {reference.global_forward_batches}")
    expect_same(params(resumed.driver), params(reference.driver), "resumed vs unbroken run")


# ----------------------------------------------------------------- end to end
@check("end-to-end", "evaluation and prediction dataloaders may have other batch sizes than the train dataloader's, "
                     "even where the engine is bound to the train batch size")
def other_batch_sizes_for_evaluation_and_prediction(kit: BackendKit) -> None:
    model = kit.make_model()
    options = dict(kit.train_batch_options(10)) if kit.train_batch_options else {}
    trainer = Trainer(model, kit.loader(10), kit.make_optimizer(model, 0.5), driver=kit.driver, device="cpu",
                      n_epochs=2, evaluate_dataloaders={"dev": kit.loader(7, seed=1)}, metrics={"acc": Accuracy()},
                      progress_bar=None, **options)
    trainer.run(num_eval_sanity_batch=1)
    evaluated = trainer.evaluate()
    expect(set(evaluated) == {"acc#acc#dev"}, f"Trainer.evaluate() with batches of 7 returned {evaluated}")
    predicted = trainer.predict(kit.loader(13, n=40, seed=2))
    expect(len(predicted.get("pred", ())) == 40, f"Trainer.predict() over 40 samples in batches of 13 returned "
           f"{ {name: np.shape(value) for name, value in predicted.items()} }")
    alone = Evaluator(model, kit.loader(9, seed=2), {"acc": Accuracy()}, driver=trainer.driver, verbose=0).run()
    expect(set(alone) == {"acc#acc"}, f"an Evaluator over the trained driver, batches of 9, returned {alone}")



@check("end-to-end", "Trainer and Evaluator train the kit's classifier to >= 90% accuracy through the public API")
def trainer_and_evaluator(kit: BackendKit) -> None:
    model = kit.make_model()
    trainer = Trainer(model, kit.batches(), kit.make_optimizer(model, 0.5), driver=kit.driver, device="cpu",
                      n_epochs=5, evaluate_dataloaders={"dev": kit.batches(seed=1)}, metrics={"acc": Accuracy()},
                      progress_bar=None, monitor="acc")
    trainer.run()
    results = Evaluator(model, kit.batches(seed=2), {"acc": Accuracy()}, driver=kit.driver, verbose=0).run()
    expect(results.get("acc#acc", 0) >= 0.9, f"a linear classifier on separable data reached only {results}")
