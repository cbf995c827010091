"""The driver contract (DESIGN.md §4), checked the same way on every installed backend.

Each assertion message says which contract rule broke and what the driver returned.
"""

from __future__ import annotations

import contextlib
import json
import struct

import numpy as np
import pytest

from drivetrain import Accuracy, Driver, DriverError, Evaluator, Trainer, available_drivers
from drivetrain._plugins import create_driver, resolve_spec


def build(kit, lr=0.1, **options):
    model = kit.make_model()
    driver = create_driver(kit.driver, model, "cpu", **options)
    driver.set_optimizers(kit.make_optimizer(driver.unwrap_model(), lr))
    driver.setup()
    return driver


def params(driver: Driver) -> dict[str, np.ndarray]:
    return {k: driver.tensor_to_numpy(v).copy() for k, v in driver.model_state().items()}


def train_one(driver: Driver, batch, scale: float = 1.0) -> None:
    fn, sig = driver.get_model_call_fn(None)
    driver.set_model_mode("train")
    with driver.auto_cast():
        out = driver.model_call(batch, fn, sig)
    loss = out["loss"]
    driver.backward(loss / scale if scale != 1.0 else loss)


# ------------------------------------------------------------------ discovery
def test_discovery_spec_and_auto(kit):
    spec = available_drivers()[kit.driver]
    assert spec.framework == kit.framework, f"DriverSpec.framework={spec.framework!r}, expected {kit.framework!r}"
    model = kit.make_model()
    assert resolve_spec("auto", model).name == kit.driver, "driver='auto' must claim the backend's own model class"
    driver = create_driver("auto", model, "cpu")
    assert isinstance(driver, Driver), f"the factory returned {type(driver)!r}, not a drivetrain.Driver"
    assert driver.name == kit.driver, f"Driver.name={driver.name!r} differs from the spec name {kit.driver!r}"


def test_single_process_identity(kit):
    driver = build(kit)
    assert (driver.rank, driver.local_rank, driver.world_size) == (0, 0, 1), "single driver: rank 0 of 1"
    assert driver.is_global_zero and not driver.is_distributed()
    driver.barrier()
    assert driver.broadcast_object({"a": 1}) == {"a": 1}, "broadcast_object must return the object on one process"
    assert driver.all_gather_object(5) == [5], "all_gather_object must return [obj] on one process"
    reduced = driver.all_reduce(np.array([1.0, 2.0]), "sum")
    np.testing.assert_array_equal(reduced, [1.0, 2.0], err_msg="all_reduce must be the identity on one process")


# ---------------------------------------------------------------------- model
def test_model_call_matches_batch_keys_and_returns_loss(kit):
    driver = build(kit)
    fn, sig = driver.get_model_call_fn(None)
    batch = driver.move_data_to_device(kit.batches()[0])
    out = driver.model_call(batch, fn, sig)
    loss = driver.tensor_to_numpy(out["loss"])
    assert isinstance(loss, np.ndarray) and loss.shape == (), f"tensor_to_numpy(loss) gave {loss!r}, expected a 0-d array"
    assert np.isfinite(loss)
    pred = driver.tensor_to_numpy(out["pred"])
    assert pred.shape == (10, 3), f"tensor_to_numpy(pred).shape={pred.shape}"


def test_contexts_are_usable(kit):
    driver = build(kit)
    for name in ("no_grad", "auto_cast", "no_sync"):
        ctx = getattr(driver, name)()
        assert isinstance(ctx, contextlib.AbstractContextManager) or hasattr(ctx, "__enter__"), (
            f"Driver.{name}() returned {ctx!r}, not a context manager")
        with ctx:
            pass
    driver.set_model_mode("eval")
    driver.set_model_mode("train")


def test_unwrap_model_is_the_users_model(kit):
    model = kit.make_model()
    driver = create_driver(kit.driver, model, "cpu")
    assert driver.unwrap_model() is model


# --------------------------------------------------------------- optimisation
def test_backward_and_step_change_parameters_zero_grad_resets(kit):
    driver = build(kit)
    before = params(driver)
    train_one(driver, driver.move_data_to_device(kit.batches()[0]))
    driver.step()
    after = params(driver)
    assert any(not np.array_equal(before[k], after[k]) for k in before), "backward + step left every parameter unchanged"
    driver.zero_grad()
    driver.step()
    again = params(driver)
    for k in after:
        np.testing.assert_array_equal(after[k], again[k], err_msg=f"zero_grad did not reset the gradient of {k!r}")


def test_divided_losses_accumulate_like_one_loss(kit):
    batch = kit.batches()[0]
    once = build(kit)
    train_one(once, once.move_data_to_device(batch))
    once.step()
    twice = build(kit)
    b = twice.move_data_to_device(batch)
    train_one(twice, b, scale=2.0)
    train_one(twice, b, scale=2.0)
    twice.step()
    p1, p2 = params(once), params(twice)
    for k in p1:
        np.testing.assert_allclose(p2[k], p1[k], rtol=1e-5, atol=1e-6,
                                   err_msg=f"two backward(loss/2) must equal one backward(loss) for {k!r}")


def test_grad_clip_bounds_the_update(kit):
    batch = kit.batches()[0]
    free = build(kit, lr=1.0)
    clipped = build(kit, lr=1.0, grad_clip=1e-3)
    start = params(free)
    for d in (free, clipped):
        train_one(d, d.move_data_to_device(batch))
        d.step()
    moved_free = sum(float(np.sum((params(free)[k] - start[k]) ** 2)) for k in start) ** 0.5
    moved_clip = sum(float(np.sum((params(clipped)[k] - start[k]) ** 2)) for k in start) ** 0.5
    assert moved_clip <= 1e-3 * 1.01, f"with grad_clip=1e-3 and lr=1 the step norm was {moved_clip}"
    assert moved_free > moved_clip


def test_set_optimizers_rejects_a_foreign_object(kit):
    driver = create_driver(kit.driver, kit.make_model(), "cpu")
    with pytest.raises(DriverError, match="optimizers="):
        driver.set_optimizers(object())


# ----------------------------------------------------------------------- data
def test_move_data_keeps_nested_structure(kit):
    driver = build(kit)
    batch = kit.batches()[0]
    nested = {"a": [batch["x"], (batch["target"], "label")], "n": 3}
    moved = driver.move_data_to_device(nested)
    assert isinstance(moved, dict) and isinstance(moved["a"], list) and isinstance(moved["a"][1], tuple)
    assert moved["n"] == 3 and moved["a"][1][1] == "label", "non-tensors must pass through unchanged"
    np.testing.assert_array_equal(driver.tensor_to_numpy(moved["a"][0]), driver.tensor_to_numpy(batch["x"]))


def test_check_dataloader_legality_names_the_argument(kit):
    driver = build(kit)
    driver.check_dataloader_legality(kit.batches(), argument="train_dataloader")
    with pytest.raises(DriverError, match="train_dataloader="):
        driver.check_dataloader_legality(42, argument="train_dataloader")


# ---------------------------------------------------------------------- state
def test_state_round_trip_through_a_pickle_free_file(kit, tmp_path):
    driver = build(kit)
    saved = params(driver)
    path = str(tmp_path / "state.safetensors")
    driver.save_tensors(driver.model_state(), path)
    with open(path, "rb") as f:
        raw = f.read()
    (header_len,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + header_len])
    assert set(header) - {"__metadata__"} == set(saved), "save_tensors must write a safetensors file of every tensor"
    train_one(driver, driver.move_data_to_device(kit.batches()[0]))
    driver.step()
    driver.load_model_state(driver.load_tensors(path))
    restored = params(driver)
    for k in saved:
        np.testing.assert_array_equal(restored[k], saved[k], err_msg=f"load_model_state did not restore {k!r}")


def test_load_model_state_with_wrong_names_fails_clearly(kit):
    driver = build(kit)
    with pytest.raises(Exception, match="(?i)key|name|missing|unexpected"):
        driver.load_model_state({"not_a_parameter": next(iter(driver.model_state().values()))})


# ----------------------------------------------------------------- end to end
def test_trainer_and_evaluator_through_the_public_api(kit):
    model = kit.make_model()
    trainer = Trainer(model, kit.batches(), kit.make_optimizer(model, 0.5), driver=kit.driver, device="cpu",
                      n_epochs=5, evaluate_dataloaders={"dev": kit.batches(seed=1)}, metrics={"acc": Accuracy()},
                      progress_bar=None, monitor="acc")
    trainer.run()
    results = Evaluator(model, kit.batches(seed=2), {"acc": Accuracy()}, driver=kit.driver, verbose=0).run()
    assert results["acc#acc"] >= 0.9, f"a linear classifier on separable data reached only {results}"
