"""Every bad argument fails at construction with a message naming it, the value and what is accepted."""

from __future__ import annotations

import pytest

from drivetrain import (
    Accuracy,
    BatchMismatchError,
    Callback,
    CallbackError,
    ConfigurationError,
    DriverError,
    DriverNotFoundError,
    Evaluator,
    Event,
    Trainer,
)
from drivetrain_numpy import SGD, ArrayLoader, LinearModel

from .conftest import make_classification, make_regression


def build(**overrides):
    model = LinearModel(3, 1)
    kwargs = dict(model=model, train_dataloader=ArrayLoader(make_regression()),
                  optimizers=SGD(model.params, model.grads), driver="numpy", progress_bar=None)
    kwargs.update(overrides)
    return Trainer(**kwargs)


@pytest.mark.parametrize(
    ("overrides", "pattern"),
    [
        ({"driver": "nope"}, r"driver='nope' is unknown; installed drivers: .*numpy"),
        ({"driver": "numpi"}, r"Did you mean 'numpy'\?"),
        ({"driver": 3}, r"driver=3"),
        ({"evaluate_every": 0}, r"evaluate_every=0 is not accepted; use an int > 0"),
        ({"evaluate_every": "often"}, r"evaluate_every='often'"),
        ({"accumulation_steps": 0}, r"accumulation_steps=0 is not accepted; it must be an int >= 1"),
        ({"n_epochs": 0}, r"n_epochs=0 is not accepted; it must be an int >= 1"),
        ({"n_epochs": 1.5}, r"n_epochs=1.5"),
        ({"n_batches": 0}, r"n_batches=0"),
        ({"overfit_batches": -3}, r"overfit_batches=-3"),
        ({"metrics": {"acc": Accuracy()}}, r"metrics were given but evaluate_dataloaders=None"),
        ({"evaluate_dataloaders": [1]}, r"evaluate_dataloaders were given but metrics=None"),
        ({"metrics": {"acc": "accuracy"}, "evaluate_dataloaders": [1]}, r"metrics\['acc'\]=str is not a drivetrain Metric"),
        ({"monitor": "f1", "metrics": {"acc": Accuracy()}, "evaluate_dataloaders": [1]},
         r"monitor='f1' names no single metric result; it can be one of \['acc', 'acc#acc'\]"),
        ({"monitor": "acc"}, r"monitor='acc' was given but there are no metrics"),
        ({"train_dataloader": None}, r"train_dataloader=None"),
        ({"train_dataloader": 5}, r"train_dataloader=int is not iterable"),
        ({"optimizers": object()}, r"optimizers=builtins.object: the numpy driver needs"),
        ({"optimizers": None}, r"optimizers=None"),
        ({"device": "cuda"}, r"device='cuda' is not accepted by the numpy driver"),
        ({"fp16": "yes"}, r"fp16='yes'"),
        ({"precision": "fp8"}, r"precision='fp8' is not accepted"),
        ({"precision": "bf16"}, r"precision='bf16' is not supported by driver 'numpy'; accepted: fp32"),
        ({"fp16": True, "precision": "bf16"}, r"fp16=True conflicts with precision='bf16'"),
        ({"callbacks": "progress"}, r"callbacks='progress' is not accepted"),
        ({"callbacks": [object()]}, r"each item must be a drivetrain.Callback"),
        ({"progress_bar": "fancy"}, r"progress_bar='fancy'"),
        ({"input_mapping": 3}, r"input_mapping=3 is not accepted"),
        ({"input_mapping": {}, "train_input_mapping": {}}, r"input_mapping and train_input_mapping were both given"),
        ({"batch_step_fn": "step"}, r"batch_step_fn='step' must be a function"),
        ({"train_fn": "missing_method"}, r"train_fn/evaluate_fn='missing_method': the model LinearModel has no method"),
        ({"grad_clip": -1}, r"grad_clip=-1 must be a positive number"),
        ({"unknown_option": 1}, r"unexpected argument\(s\) \['unknown_option'\]"),
        ({"numpy_kwargs": {"threads": 2}}, r"numpy_kwargs=\{'threads': 2\}"),
    ],
)
def test_bad_argument_is_named(overrides, pattern):
    with pytest.raises((ConfigurationError, DriverError, DriverNotFoundError)) as info:
        build(**overrides)
    import re

    assert re.search(pattern, str(info.value)), str(info.value)


def test_a_misspelt_driver_options_argument_is_refused_with_the_right_name():
    with pytest.raises(ConfigurationError, match=r"nmpy_kwargs=: no driver is called 'nmpy'; did you mean numpy_kwargs="):
        build(nmpy_kwargs={"threads": 2})
    with pytest.raises(ConfigurationError, match=r"did you mean paddle_kwargs="):  # known, though not installed here
        build(pddle_kwargs={})


def test_options_for_drivers_not_installed_here_are_passed_over():
    """One script may carry options for several frameworks; names far from every known driver pass."""
    build(paddle_kwargs={"overlap": True}, mindspore_kwargs={"mode": 0}, torch_xla_kwargs={})


def test_known_backend_not_installed_gives_pip_command():
    from drivetrain import available_drivers
    from drivetrain.backend._plugins import KNOWN_BACKENDS

    missing = [name for name in KNOWN_BACKENDS if name not in available_drivers()]
    if not missing:
        pytest.skip("every backend this project publishes is installed here")
    name = missing[0]
    with pytest.raises(DriverNotFoundError, match=rf'driver=\'{name}\' is not installed.*pip install "drivetrain\[{name}\]"'):
        build(driver=name)


def test_auto_without_a_claiming_backend():
    with pytest.raises(DriverNotFoundError, match=r"driver='auto' found no installed driver for a model of type builtins.object"):
        Trainer(object(), [1], None, driver="auto", batch_step_fn=lambda t, b: None, progress_bar=None)


def test_batch_missing_a_forward_parameter_names_it_and_the_keys():
    trainer = build(train_dataloader=ArrayLoader({"inputs": make_regression()["x"], "target": make_regression()["target"]}))
    with pytest.raises(BatchMismatchError) as info:
        trainer.run()
    message = str(info.value)
    assert "needs parameter(s) ['x']" in message and "['inputs', 'target']" in message
    assert "input_mapping" in message


def test_output_without_loss_is_explained():
    trainer = build(output_mapping=lambda out: {"pred": out["pred"]})
    with pytest.raises(BatchMismatchError, match=r"returned dict with keys \['pred'\], with no loss in it.*output_mapping"):
        trainer.run()


def test_raising_callback_is_named_and_end_events_still_run():
    seen = []

    class Boom(Callback):
        def on_train_batch_end(self, trainer):
            raise ValueError("bad value")

    trainer = build(callbacks=[Boom()])
    trainer.add_callback_fn(Event.on_exception(), lambda t, e: seen.append(type(e).__name__))
    trainer.add_callback_fn(Event.on_train_end(), lambda t: seen.append("end"))
    with pytest.raises(CallbackError, match="callback Boom raised ValueError during on_train_batch_end: bad value"):
        trainer.run()
    assert seen == ["CallbackError", "end"]


def test_callback_signature_checked_when_added():
    trainer = build()
    with pytest.raises(ConfigurationError, match=r"cannot be called for on_evaluate_end; it receives \(trainer, results\)"):
        trainer.add_callback_fn(Event.on_evaluate_end(), lambda trainer: None)


def test_event_filter_arguments_are_checked():
    with pytest.raises(ConfigurationError, match=r"every must be an int >= 1"):
        Event.on_train_batch_end(every=0)
    with pytest.raises(ConfigurationError, match=r"takes one of every/once/filter_fn"):
        Event.on_train_batch_end(every=2, once=True)


def test_duplicate_callback_names_are_rejected():
    class Same(Callback):
        pass

    with pytest.raises(ConfigurationError, match="share callback_name='Same'"):
        build(callbacks=[Same(), Same()])


def test_monitor_of_a_metric_with_several_results_is_refused_early():
    from drivetrain import ClassifyFPreRecMetric

    with pytest.raises(ConfigurationError, match=r"monitor='fpr' names no single metric result; it can be one of "
                                                 r"\['f', 'f#fpr', 'pre', 'pre#fpr', 'rec', 'rec#fpr'\]"):
        build(metrics={"fpr": ClassifyFPreRecMetric(num_classes=3)}, evaluate_dataloaders=[1], monitor="fpr")


def test_monitor_picks_the_first_dataloader_given_and_explains_ambiguity():
    from drivetrain._callbacks.monitor import find_monitor_value

    results = {"acc#acc#test": 0.5, "acc#acc#dev": 0.9, "f#fpr#dev": 0.7, "pre#fpr#dev": 0.6}
    assert find_monitor_value(results, "acc") == 0.5
    assert find_monitor_value(results, "acc#acc#dev") == 0.9
    assert find_monitor_value(results, "f") == 0.7
    with pytest.raises(ConfigurationError, match=r"monitor='fpr' is ambiguous: it matches \['f#fpr#dev', 'pre#fpr#dev'\]"):
        find_monitor_value(results, "fpr")


def test_driver_instance_with_driver_options_is_refused():
    trainer = build()
    with pytest.raises(ConfigurationError, match=r"driver= is a Driver instance, so \['grad_clip'\] would be ignored"):
        build(driver=trainer.driver, model=trainer.model, grad_clip=1.0)
    with pytest.raises(ConfigurationError, match="Driver built for another model"):
        build(driver=trainer.driver)


def test_callback_method_signature_checked_when_added():
    class Wrong(Callback):
        def on_evaluate_end(self, trainer):
            pass

    with pytest.raises(ConfigurationError, match=r"Wrong.on_evaluate_end.*it receives \(trainer, results\)"):
        build(callbacks=[Wrong()])


def test_monitor_missing_at_run_time_lists_results():
    data = make_classification()
    model = LinearModel(4, 3, loss="ce")
    trainer = Trainer(model, ArrayLoader(data), SGD(model.params, model.grads), driver="numpy", progress_bar=None,
                      metrics={"acc": Accuracy()}, evaluate_dataloaders=ArrayLoader(data))
    results = trainer.evaluate()
    with pytest.raises(ConfigurationError, match=r"monitor='f' matches no evaluation result; results are \['acc#acc'\]"):
        trainer.monitor_value(results, "f")


def test_evaluator_bad_metric_input_names_metric_and_keys():
    data = make_classification()
    model = LinearModel(4, 3, loss="ce")
    evaluator = Evaluator(model, ArrayLoader({"x": data["x"], "target": data["target"]}),
                          {"acc": Accuracy()}, driver="numpy", output_mapping=lambda out: {"scores": out["pred"]},
                          verbose=0)
    with pytest.raises(BatchMismatchError, match=r"metrics\['acc'\].update\(\) needs 'pred' \(or 'logits'.*output_mapping=\{'scores': 'pred'\}"):
        evaluator.run()


def test_run_arguments_are_checked():
    trainer = build()
    with pytest.raises(ConfigurationError, match="num_train_batch_per_epoch=0"):
        trainer.run(num_train_batch_per_epoch=0)


def test_a_backend_whose_framework_has_no_wheels_for_this_python_says_which_python(monkeypatch):
    from drivetrain.backend._plugins import KNOWN_BACKENDS, install_hint

    known = KNOWN_BACKENDS["oneflow"]
    monkeypatch.setattr("sys.version_info", (3, 11, 7, "final", 0))
    hint = install_hint("oneflow")
    assert hint.startswith("no install works on this Python") and "Python <= 3.10" in hint
    assert ("Create a Python 3.10 environment and install there from a drivetrain checkout (Python 3.10): pip install "
            "-c constraints.txt -e . -e backends/oneflow oneflow==0.9.0") in hint
    monkeypatch.setattr("sys.version_info", (3, 10, 13, "final", 0))
    assert install_hint("oneflow") == f'pip install "drivetrain[oneflow]" {known.framework_pin}'
    assert install_hint("mxnet") == "pip install drivetrain-mxnet"
