"""Mapping semantics (applied once, seen everywhere), model outputs of every shape, tuple batches, loss_fn.

The models subclass the numpy backend's LinearModel and only change what forward
returns or which names it takes, the way ecosystem models differ from ours.
"""

from __future__ import annotations

import ast
import collections
import dataclasses
import re
from typing import Any, NamedTuple

import numpy as np
import pytest

from drivetrain import Accuracy, BatchMismatchError, Callback, Evaluator, Metric, Trainer

from .conftest import drivetrain_numpy, make_classification

LinearModel, SGD, ArrayLoader = drivetrain_numpy.LinearModel, drivetrain_numpy.SGD, drivetrain_numpy.ArrayLoader


@dataclasses.dataclass
class Output:
    loss: Any = None
    pred: Any = None


class NamedOutput(NamedTuple):
    loss: Any
    pred: Any


class ModelOutputLike(collections.OrderedDict):
    """What Hugging Face returns: an ordered dict (None fields absent) with attribute access."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


SHAPES = {
    "dict": lambda loss, pred: {"loss": loss, "pred": pred},
    "dataclass": lambda loss, pred: Output(loss, pred),
    "namedtuple": lambda loss, pred: NamedOutput(loss, pred),
    "tuple": lambda loss, pred: (loss, pred),
    "list": lambda loss, pred: [loss, pred],
    "modeloutput": lambda loss, pred: ModelOutputLike(loss=loss, pred=pred),
}


class ShapedModel(LinearModel):
    """forward returns the loss and prediction in the shape named ``shape``."""

    def __init__(self, shape: str) -> None:
        super().__init__(4, 3, loss="ce")
        self.shape = shape

    def forward(self, x, target):
        out = super().forward(x, target)
        return SHAPES[self.shape](out["loss"], out["pred"])

    __call__ = forward


class HFNamesModel(LinearModel):
    """Hugging Face names: ``labels`` in, ``logits`` out."""

    def __init__(self) -> None:
        super().__init__(4, 3, loss="ce")

    def forward(self, x, labels):
        out = super().forward(x, labels)
        return ModelOutputLike(loss=out["loss"], logits=out["pred"])

    __call__ = forward


def data(n: int = 90, seed: int = 0, **rename: str) -> dict[str, np.ndarray]:
    arrays = make_classification(n=n, seed=seed)
    return {rename.get(k, k): v for k, v in arrays.items()}


def trainer_for(model, train, dev=None, **kwargs) -> Trainer:
    opt = SGD(model.params, model.grads, lr=0.5)
    kwargs.setdefault("progress_bar", None)
    if dev is not None:
        kwargs.setdefault("metrics", {"acc": Accuracy()})
        kwargs.setdefault("evaluate_dataloaders", dev)
    return Trainer(model, train, opt, driver="numpy", n_epochs=3, **kwargs)


# ------------------------------------------------------------------------------ mapping semantics
class Recorder(Callback):
    def __init__(self) -> None:
        self.batch_keys: list[list[str]] = []
        self.output_keys: list[list[str]] = []

    def on_train_batch_begin(self, trainer, batch, indices):
        self.batch_keys.append(sorted(batch))

    def on_before_backward(self, trainer, outputs):
        self.output_keys.append(sorted(outputs))


class SeenBy(Metric):
    """Accuracy that also records the names it was fed from."""

    def __init__(self) -> None:
        super().__init__()
        self.register_element("correct", 0.0)
        self.register_element("total", 0.0)

    def update(self, scores, target):
        self.correct += (scores.argmax(-1) == target).sum()
        self.total += target.size

    def get_metric(self):
        return {"acc": float(self.correct) / max(float(self.total), 1.0)}


def test_input_mapping_runs_once_and_everyone_sees_the_mapped_batch():
    calls = []

    def mapping(batch):
        calls.append(1)
        return {"x": batch["feat"], "target": batch["label"]}

    recorder = Recorder()
    train = ArrayLoader(data(feat="feat", x="feat", target="label"), batch_size=10)
    dev = ArrayLoader(data(seed=1, x="feat", target="label"), batch_size=30)
    trainer = trainer_for(LinearModel(4, 3, loss="ce"), train, dev, input_mapping=mapping, callbacks=[recorder],
                          evaluate_every=-1)
    trainer.run(num_eval_sanity_batch=0)
    # 9 train batches x 3 epochs, plus 3 dev batches x 3 evaluations: once each, never twice
    assert len(calls) == 27 + 9
    assert recorder.batch_keys[0] == ["target", "x"]
    assert trainer.evaluate()["acc#acc"] > 0.9


def test_output_mapping_is_applied_before_metrics_and_callbacks():
    recorder = Recorder()
    train = ArrayLoader(data(), batch_size=10)
    dev = ArrayLoader(data(seed=1), batch_size=30)
    trainer = trainer_for(LinearModel(4, 3, loss="ce"), train, dev, metrics={"acc": SeenBy()},
                          output_mapping={"pred": "scores"}, callbacks=[recorder])
    trainer.run(num_eval_sanity_batch=0)
    assert recorder.output_keys[0] == ["loss", "scores"]
    assert trainer.evaluate()["acc#acc"] > 0.9


# ------------------------------------------------------------------------------ output shapes
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_every_output_shape_trains_evaluates_and_predicts(shape):
    train = ArrayLoader(data(), batch_size=10)
    dev = ArrayLoader(data(seed=1), batch_size=30)
    trainer = trainer_for(ShapedModel(shape), train, dev)
    trainer.run(num_eval_sanity_batch=0)
    assert trainer.evaluate()["acc#acc"] > 0.9
    predictions = trainer.predict(dev)
    assert predictions["pred"].shape == (90, 3)
    assert "loss" not in predictions  # a scalar per batch is not a per-sample output


def test_hugging_face_names_work_with_accuracy_unchanged():
    train = ArrayLoader(data(target="labels"), batch_size=10)
    dev = ArrayLoader(data(seed=1, target="labels"), batch_size=30)
    trainer = trainer_for(HFNamesModel(), train, dev)
    trainer.run(num_eval_sanity_batch=0)
    assert trainer.evaluate()["acc#acc"] > 0.9
    assert set(trainer.predict(dev)) == {"logits"}


def test_bare_outputs_train_with_loss_fn_and_evaluate_as_pred():
    model = LinearModel(4, 3, loss="ce")

    class Zoo(LinearModel):
        def forward(self, x):
            return np.asarray(x, dtype=np.float32) @ self.params["weight"] + self.params["bias"]

        __call__ = forward

    zoo = Zoo(4, 3, loss="ce")
    zoo.params, zoo.grads = model.params, model.grads  # the same weights; the loss is computed by model

    def loss_fn(outputs, batch):
        assert outputs.shape == (len(batch["target"]), 3)  # the bare logits, as returned
        return model.forward(batch["x"], batch["target"])["loss"]

    train = ArrayLoader(data(), batch_size=10)
    dev = ArrayLoader(data(seed=1), batch_size=30)
    recorder = Recorder()
    trainer = trainer_for(zoo, train, dev, loss_fn=loss_fn, callbacks=[recorder])
    trainer.run(num_eval_sanity_batch=0)
    assert recorder.output_keys[0] == ["loss", "pred"]
    assert trainer.evaluate()["acc#acc"] > 0.9


def test_an_output_without_a_loss_names_what_was_returned():
    class NoLoss(LinearModel):
        def forward(self, x, target):
            return {"pred": super().forward(x, target)["pred"], "hidden": x}

        __call__ = forward

    trainer = trainer_for(NoLoss(4, 3, loss="ce"), ArrayLoader(data(), batch_size=10))
    with pytest.raises(BatchMismatchError, match=r"returned dict with keys \['pred', 'hidden'\], with no loss.*loss_fn="):
        trainer.run()


def test_nested_outputs_are_flattened_for_prediction():
    class Nested(LinearModel):
        def forward(self, x, target):
            out = super().forward(x, target)
            return {"loss": out["loss"], "heads": {"cls": out["pred"], "all": (out["pred"], out["pred"] * 2)}}

        __call__ = forward

    dev = ArrayLoader(data(seed=1), batch_size=30)
    predictions = trainer_for(Nested(4, 3, loss="ce"), dev).predict(dev)
    assert sorted(predictions) == ["heads.all.0", "heads.all.1", "heads.cls"]
    np.testing.assert_array_equal(predictions["heads.all.1"], predictions["heads.cls"] * 2)


# ------------------------------------------------------------------------------ tuple batches
def tuple_batches(n: int = 90, seed: int = 0, size: int = 10, extra: bool = False) -> list[tuple]:
    arrays = make_classification(n=n, seed=seed)
    out = []
    for i in range(0, n, size):
        item = (arrays["x"][i:i + size], arrays["target"][i:i + size])
        out.append(item + (np.zeros(len(item[1])),) if extra else item)
    return out


def test_tuple_batches_are_matched_by_position():
    recorder = Recorder()
    trainer = trainer_for(LinearModel(4, 3, loss="ce"), tuple_batches(), tuple_batches(seed=1, size=30),
                          callbacks=[recorder])
    trainer.run(num_eval_sanity_batch=0)
    assert recorder.batch_keys[0] == ["target", "x"]
    assert trainer.evaluate()["acc#acc"] > 0.9


def test_a_tuple_batch_that_fits_no_signature_suggests_a_mapping_that_works():
    trainer = trainer_for(LinearModel(4, 3, loss="ce"), tuple_batches(extra=True))
    with pytest.raises(BatchMismatchError, match=r"tuple of 3 values but .*forward\(x, target\)") as info:
        trainer.run()
    suggested = re.search(r"input_mapping=(lambda batch: \{.*?\})", str(info.value)).group(1)
    fixed = trainer_for(LinearModel(4, 3, loss="ce"), tuple_batches(extra=True), input_mapping=eval(suggested))
    fixed.run()
    assert fixed.global_forward_batches == 27


# ------------------------------------------------------------------------------ errors whose fixes work
class Predicts(LinearModel):
    def evaluate_step(self, x):
        return {"pred": np.asarray(x, dtype=np.float32) @ self.params["weight"] + self.params["bias"]}


def test_missing_metric_input_suggests_a_mapping_that_works():
    dev = ArrayLoader(data(seed=1, target="gold"), batch_size=30)
    model = Predicts(4, 3, loss="ce")
    evaluator = Evaluator(model, dev, {"acc": Accuracy()}, driver="numpy", verbose=0, progress_bar=None)
    with pytest.raises(BatchMismatchError, match=r"needs 'target' \(or 'labels', 'label'") as info:
        evaluator.run()
    suggestion = ast.literal_eval(re.search(r"input_mapping=(\{.*?\})", str(info.value)).group(1))
    assert suggestion == {"gold": "target"}  # the batch key the model did not take
    fixed = Evaluator(model, dev, {"acc": Accuracy()}, driver="numpy", verbose=0, progress_bar=None,
                      input_mapping=suggestion)
    assert 0.0 <= fixed.run()["acc#acc"] <= 1.0


def test_trainer_metric_error_names_the_trainer_arguments_and_the_fix_works():
    class Scores(LinearModel):
        def forward(self, x, target):
            out = super().forward(x, target)
            return {"loss": out["loss"], "scores": out["pred"]}

        __call__ = forward

    train, dev = ArrayLoader(data(), batch_size=10), ArrayLoader(data(seed=1), batch_size=30)
    trainer = trainer_for(Scores(4, 3, loss="ce"), train, dev)
    with pytest.raises(BatchMismatchError, match=r"evaluate_output_mapping=\{'scores': 'pred'\}") as info:
        trainer.run()
    suggestion = ast.literal_eval(re.search(r"evaluate_output_mapping=(\{.*?\})", str(info.value)).group(1))
    fixed = trainer_for(Scores(4, 3, loss="ce"), train, dev, evaluate_output_mapping=suggestion)
    fixed.run()
    assert fixed.evaluate()["acc#acc"] > 0.9


def test_a_missing_parameter_suggests_a_renaming_that_works():
    renamed = data(x="features")
    trainer = trainer_for(LinearModel(4, 3, loss="ce"), ArrayLoader(renamed, batch_size=10))
    with pytest.raises(BatchMismatchError, match=r"needs parameter\(s\) \['x'\].*input_mapping=\{'features': 'x'\}") \
            as info:
        trainer.run()
    suggestion = ast.literal_eval(re.search(r"input_mapping=(\{.*?\})", str(info.value)).group(1))
    fixed = trainer_for(LinearModel(4, 3, loss="ce"), ArrayLoader(renamed, batch_size=10), input_mapping=suggestion)
    fixed.run()
    assert fixed.global_forward_batches == 27
