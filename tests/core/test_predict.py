"""Prediction (Trainer.predict, drivetrain.predict): order, padding, streaming to files, and evaluation progress."""

from __future__ import annotations

import io
import json
import time

import numpy as np
import pytest

from drivetrain import Accuracy, ConfigurationError, Evaluator, Trainer, load_predictions, predict

from .conftest import drivetrain_numpy, make_classification

LinearModel, SGD, ArrayLoader = drivetrain_numpy.LinearModel, drivetrain_numpy.SGD, drivetrain_numpy.ArrayLoader


class Sequences(LinearModel):
    """predict_step returns per-sample sequences whose length changes from batch to batch (padded collators)."""

    def predict_step(self, x):
        x = np.asarray(x, dtype=np.float32)
        length = 2 + int(abs(x[0, 0] * 10)) % 3
        return {"tokens": np.tile(np.arange(length, dtype=np.int64), (len(x), 1)), "first": x[:, 0]}


def expected_logits(model, x):
    return x @ model.params["weight"] + model.params["bias"]


def test_predict_returns_every_output_in_dataset_order():
    arrays = make_classification(n=45)
    model = LinearModel(4, 3, loss="ce", seed=3)
    loader = ArrayLoader(arrays, batch_size=8)
    out = predict(model, loader, driver="numpy", progress_bar=None)
    assert set(out) == {"pred"}
    np.testing.assert_allclose(out["pred"], expected_logits(model, arrays["x"]), rtol=1e-6)
    assert len(predict(model, loader, driver="numpy", progress_bar=None, num_batches=2)["pred"]) == 16


def test_trainer_predict_after_training_keeps_the_trainer_usable():
    arrays = make_classification()
    model = LinearModel(4, 3, loss="ce")
    trainer = Trainer(model, ArrayLoader(arrays, batch_size=10), SGD(model.params, model.grads, lr=0.5),
                      driver="numpy", n_epochs=2, progress_bar=None,
                      evaluate_dataloaders=ArrayLoader(arrays, batch_size=30), metrics={"acc": Accuracy()})
    trainer.run(num_eval_sanity_batch=0)
    out = trainer.predict(ArrayLoader(arrays, batch_size=30))
    assert (out["pred"].argmax(-1) == arrays["target"]).mean() == pytest.approx(trainer.evaluate()["acc#acc"])
    assert model.training  # back in training mode


def test_outputs_of_changing_length_are_padded_and_streaming_gives_the_same_arrays(tmp_path):
    arrays = make_classification(n=40)
    model = Sequences(4, 3)
    loader = ArrayLoader(arrays, batch_size=6)
    in_memory = predict(model, loader, driver="numpy", progress_bar=None, pad_value=-1)
    lengths = {2 + int(abs(arrays["x"][i, 0] * 10)) % 3 for i in range(0, 40, 6)}
    assert len(lengths) > 1, "the data must give batches of different lengths"
    assert in_memory["tokens"].shape == (40, max(lengths))
    assert (in_memory["tokens"] == -1).any()
    streamed = predict(model, loader, driver="numpy", progress_bar=None, pad_value=-1, save_to=tmp_path / "out")
    for name in ("tokens", "first"):
        np.testing.assert_array_equal(np.asarray(streamed[name]), in_memory[name])
    meta = json.loads((tmp_path / "out" / "predictions.json").read_text())
    assert meta["count"] == 40 and meta["outputs"]["tokens"]["pad_value"] == -1
    assert not (tmp_path / "out" / ".parts").exists()
    again = load_predictions(tmp_path / "out")
    np.testing.assert_array_equal(np.asarray(again["first"]), arrays["x"][:, 0])
    from safetensors.numpy import load_file

    np.testing.assert_array_equal(load_file(str(tmp_path / "out" / "tokens.safetensors"))["tokens"], in_memory["tokens"])


def test_predict_fn_by_name_or_function_and_outputs_without_rows_are_left_out():
    arrays = make_classification(n=20)
    model = LinearModel(4, 3, loss="ce")
    loader = ArrayLoader(arrays, batch_size=5)
    by_function = predict(model, loader, driver="numpy", progress_bar=None,
                          predict_fn=lambda x: {"double": np.asarray(x) * 2})
    np.testing.assert_allclose(by_function["double"], arrays["x"] * 2)
    with pytest.warns(RuntimeWarning, match=r"outputs \['mean'\] do not have one row per sample"):
        out = predict(model, loader, driver="numpy", progress_bar=None,
                      predict_fn=lambda x: {"x": x, "mean": np.mean(x)})
    assert set(out) == {"x"}
    with pytest.raises(ConfigurationError, match=r"predict got unexpected argument\(s\) \['progressbar'\].*progress_bar"):
        predict(model, loader, driver="numpy", progressbar=None)


def test_a_long_evaluation_shows_progress_and_the_evaluator_takes_the_trainer_values():
    from drivetrain._progress.loop import RawLoopDisplay

    arrays = make_classification(n=40)

    class Slow(LinearModel):
        def evaluate_step(self, x, target):
            time.sleep(0.01)
            return {"pred": np.asarray(x) @ self.params["weight"]}

    out = io.StringIO()
    evaluator = Evaluator(Slow(4, 3), {"dev": ArrayLoader(arrays, batch_size=4)}, {"acc": Accuracy()},
                          driver="numpy", verbose=0, progress_bar=RawLoopDisplay(interval=0.0, file=out))
    evaluator.run()
    assert "evaluate dev: 10/10 batches" in out.getvalue()
    for value in (None, False, "raw", "none", "tqdm", "rich", "auto"):
        Evaluator(Slow(4, 3), ArrayLoader(arrays, batch_size=20), {"acc": Accuracy()}, driver="numpy", verbose=0,
                  progress_bar=value).run()
    with pytest.raises(ConfigurationError, match="progress_bar='bars' is not accepted"):
        Evaluator(Slow(4, 3), ArrayLoader(arrays), {"acc": Accuracy()}, driver="numpy", progress_bar="bars")
