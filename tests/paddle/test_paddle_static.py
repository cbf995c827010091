"""Static graph: training through paddle.jit.to_static, and exporting a paddle inference model that
paddle.jit.load and paddle.inference load and that predicts what the model predicts."""

from __future__ import annotations

import os

import numpy as np
import pytest
from paddle.static import InputSpec

from drivetrain import Accuracy, Trainer
from drivetrain._common.errors import DriverError
from drivetrain_paddle import export_inference_model

from .conftest import paddle, separable

X_SPEC = InputSpec([None, 4], "float32", "x")
TARGET_SPEC = InputSpec([None], "int64", "target")


class Classifier(paddle.nn.Layer):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = paddle.nn.Linear(4, 16)
        self.drop = paddle.nn.Dropout(0.2)
        self.fc2 = paddle.nn.Linear(16, 2)

    def forward(self, x, target=None):
        pred = self.fc2(self.drop(paddle.nn.functional.relu(self.fc1(x))))
        if target is None:
            return {"pred": pred}
        return {"loss": paddle.nn.functional.cross_entropy(pred, target), "pred": pred}


def _data(n: int = 128, seed: int = 0) -> list[dict]:
    x, y = separable(n, seed)
    return [{"x": x[i:i + 16], "target": y[i:i + 16]} for i in range(0, n, 16)]


def _fit(static: bool, **paddle_kwargs):
    paddle.seed(0)
    model = Classifier()
    options = {"to_static": True, **paddle_kwargs} if static else {}
    trainer = Trainer(model, _data(), paddle.optimizer.SGD(learning_rate=0.5, parameters=model.parameters()),
                      driver="paddle", n_epochs=5, evaluate_dataloaders=_data(64, seed=1),
                      metrics={"acc": Accuracy()}, progress_bar=None, paddle_kwargs=options)
    trainer.run(num_eval_sanity_batch=1)
    return trainer, model


# ------------------------------------------------------------------------------- training
def test_to_static_trains_like_eager_mode() -> None:
    eager, eager_model = _fit(False)
    static, static_model = _fit(True, input_spec=[X_SPEC, TARGET_SPEC])
    from paddle.jit.dy2static.program_translator import StaticFunction

    assert isinstance(static_model.__dict__["forward"], StaticFunction)
    assert "static graph" in static.driver.describe()
    for (name, a), b in zip(eager_model.state_dict().items(), static_model.state_dict().values(), strict=True):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-5, atol=1e-6, err_msg=name)
    assert static.evaluate()["acc#acc"] >= 0.9


def test_to_static_without_input_spec_and_in_sot_mode() -> None:
    trainer, _ = _fit(True)
    assert trainer.evaluate()["acc#acc"] >= 0.9
    trainer, _ = _fit(True, full_graph=False)
    assert trainer.evaluate()["acc#acc"] >= 0.9
    with pytest.raises(DriverError, match=r"input_spec'\] needs full_graph=True"):
        _fit(True, input_spec=[X_SPEC, TARGET_SPEC], full_graph=False)


@pytest.mark.parametrize(
    "spec, fragment",
    [
        ([X_SPEC, InputSpec([None], "int64", "label")],
         r"input_spec'\]\[1\] is named 'label' but parameter 1 of Classifier.forward\(x, target\) is 'target'"),
        ([X_SPEC, TARGET_SPEC, InputSpec([None], "int64", "extra")],
         r"has 3 InputSpec\(s\) but Classifier.forward\(x, target\) takes 2 input"),
        (X_SPEC, r"must be a list of paddle.static.InputSpec"),
        ([X_SPEC, "target"], r"input_spec'\]\[1\] is a str, not a paddle.static.InputSpec"),
        ([InputSpec([None, 5], "float32", "x"), TARGET_SPEC],
         r"does not fit Classifier.forward: tracing it with these shapes and dtypes failed"),
    ],
)
def test_input_spec_that_does_not_match_forward_fails_at_construction(spec, fragment) -> None:
    model = Classifier()
    with pytest.raises(DriverError, match=fragment):
        Trainer(model, _data(), paddle.optimizer.SGD(parameters=model.parameters()), driver="paddle",
                paddle_kwargs={"to_static": True, "input_spec": spec})


def test_batches_must_fill_exactly_the_spec_inputs() -> None:
    model = Classifier()
    trainer = Trainer(model, _data(), paddle.optimizer.SGD(parameters=model.parameters()), driver="paddle",
                      progress_bar=None, paddle_kwargs={"to_static": True, "input_spec": [X_SPEC]})
    with pytest.raises(DriverError, match=r"the batch also fills \['target'\], which input_spec does not cover"):
        trainer.run(num_eval_sanity_batch=0)


# --------------------------------------------------------------------------------- export
def _predict_with_paddle_inference(prefix: str, x: np.ndarray) -> np.ndarray:
    import paddle.inference as inference

    model_file = prefix + (".json" if os.path.exists(prefix + ".json") else ".pdmodel")
    config = inference.Config(model_file, prefix + ".pdiparams")
    config.disable_gpu()
    config.disable_glog_info()
    predictor = inference.create_predictor(config)
    (name,) = predictor.get_input_names()
    handle = predictor.get_input_handle(name)
    handle.reshape(list(x.shape))
    handle.copy_from_cpu(x)
    predictor.run()
    return predictor.get_output_handle(predictor.get_output_names()[0]).copy_to_cpu()


@pytest.mark.parametrize("static", [False, True])
def test_export_inference_model_predicts_what_the_model_predicts(tmp_path, static) -> None:
    trainer, model = _fit(static, **({"input_spec": [X_SPEC, TARGET_SPEC]} if static else {}))
    model.train()
    prefix = export_inference_model(trainer, tmp_path / "export" / "digits", [X_SPEC])
    assert prefix == str(tmp_path / "export" / "digits")
    assert os.path.exists(prefix + ".pdiparams")
    assert model.training  # its mode is given back
    x = separable(10, seed=3)[0]
    model.eval()
    with paddle.no_grad():
        expected = (model(paddle.to_tensor(x), paddle.zeros([10], "int64"))["pred"].numpy() if static
                    else model(paddle.to_tensor(x))["pred"].numpy())
    loaded = paddle.jit.load(prefix)
    np.testing.assert_allclose(loaded(paddle.to_tensor(x)).numpy(), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(_predict_with_paddle_inference(prefix, x), expected, rtol=1e-5, atol=1e-6)
    if static:  # training continues with the static program afterwards
        from paddle.jit.dy2static.program_translator import StaticFunction

        assert isinstance(model.__dict__["forward"], StaticFunction)


@pytest.mark.parametrize(
    "spec, fragment",
    [
        ([InputSpec([None, 4], "float32", "features")],
         r"input_spec\[0\] is named 'features' but parameter 0 of Classifier.forward\(x, target\) is 'x'"),
        ([X_SPEC, TARGET_SPEC, X_SPEC], r"has 3 InputSpec\(s\) but Classifier.forward\(x, target\) takes 2"),
        ([InputSpec([None, 7], "float32", "x")], r"input_spec=.*does not fit Classifier.forward; tracing it failed"),
        ([], r"input_spec=\[\] is empty"),
    ],
)
def test_export_with_a_spec_that_does_not_match_forward(tmp_path, spec, fragment) -> None:
    with pytest.raises(DriverError, match=fragment):
        export_inference_model(Classifier(), tmp_path / "m", spec)


def test_export_refuses_what_it_cannot_export(tmp_path) -> None:
    with pytest.raises(DriverError, match="pass a paddle.nn.Layer, or a Trainer/Evaluator"):
        export_inference_model(object(), tmp_path / "m", [X_SPEC])
    with pytest.raises(DriverError, match="not a folder"):
        export_inference_model(Classifier(), tmp_path, [X_SPEC])


def test_a_forward_without_source_code_is_explained(tmp_path) -> None:
    namespace: dict = {"paddle": paddle}
    exec(  # noqa: S102 - a class whose source Python cannot find, as in an interactive session
        "class Typed(paddle.nn.Layer):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.fc = paddle.nn.Linear(4, 2)\n"
        "    def forward(self, x, target):\n"
        "        return {'loss': paddle.nn.functional.cross_entropy(self.fc(x), target)}\n", namespace)
    model = namespace["Typed"]()
    with pytest.raises(DriverError, match=r"translates the source code of Typed.forward.*full_graph': False"):
        Trainer(model, _data(), paddle.optimizer.SGD(parameters=model.parameters()), driver="paddle",
                paddle_kwargs={"to_static": True, "input_spec": [X_SPEC, TARGET_SPEC]})
    with pytest.raises(DriverError, match=r"^export_inference_model: paddle.jit translates the source code"):
        export_inference_model(namespace["Typed"](), tmp_path / "m", [X_SPEC, TARGET_SPEC])
