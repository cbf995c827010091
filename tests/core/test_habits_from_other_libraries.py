"""What users of Keras, Lightning and the Hugging Face Trainer type first, through the public API with the numpy
driver: each is refused with the fix, or accepted as what it means, and the fix works."""

from __future__ import annotations

import pytest

from drivetrain import (
    Accuracy,
    CallbackError,
    CheckpointCallback,
    ConfigurationError,
    DriverError,
    EarlyStopCallback,
    Trainer,
    seed_everything,
)
from drivetrain._common.options import resolve_precision
from drivetrain_numpy import SGD, ArrayLoader, LinearModel

from ._callback_helpers import make_trainer, stop_after
from .conftest import make_classification


def build(train, **overrides) -> Trainer:
    model = LinearModel(4, 3, loss="ce")
    return Trainer(model, train, SGD(model.params, model.grads, lr=0.5), driver="numpy", progress_bar=None,
                   n_epochs=overrides.pop("n_epochs", 1), **overrides)


# --------------------------------------------------- the data itself where a dataloader belongs (Keras' fit(x, y))
def test_an_array_as_train_dataloader_is_refused_at_construction_naming_the_drivers_loader():
    data = make_classification()
    with pytest.raises(DriverError) as caught:
        build(data["x"])
    message = str(caught.value)
    assert message.startswith("train_dataloader=a numpy array of shape (90, 4) is the data itself, not a dataloader")
    assert "drivetrain_numpy.ArrayLoader({'x': x, 'target': y}, batch_size=32, shuffle=True)" in message
    # the fix, as the message writes it
    x, y = data["x"], data["target"]
    trainer = build(ArrayLoader({"x": x, "target": y}, batch_size=32, shuffle=True), n_epochs=5)
    trainer.run()
    assert trainer.global_forward_batches == 5 * 3


def test_a_dict_of_arrays_as_train_dataloader_says_iterating_it_gives_its_keys():
    with pytest.raises(DriverError, match=r"^train_dataloader=a dict of arrays \{'x': \(90, 4\), 'target': \(90,\)\} "
                                          r"is the data itself, not a dataloader \(iterating a dict gives its keys, not "
                                          r"batches\).*"
                                          r"ArrayLoader\("):
        build(make_classification())


def test_arrays_as_evaluate_dataloaders_are_refused_at_construction():
    train = ArrayLoader(make_classification(), batch_size=10)
    dev = make_classification(seed=1)
    with pytest.raises(DriverError, match=r"^evaluate_dataloaders\['x'\]=a numpy array of shape \(90, 4\) is the "
                                          r"data itself.*ArrayLoader\("):
        build(train, metrics={"acc": Accuracy()}, evaluate_dataloaders=dev)
    with pytest.raises(DriverError, match=r"^evaluate_dataloaders\['dev'\]=a numpy array of shape \(90, 4\) is the "
                                          r"data itself"):
        build(train, metrics={"acc": Accuracy()}, evaluate_dataloaders={"dev": dev["x"]})
    build(train, metrics={"acc": Accuracy()}, evaluate_dataloaders={"dev": ArrayLoader(dev, batch_size=32)})


def test_a_list_of_batches_is_still_a_dataloader():
    data = make_classification(n=20)
    batches = [{"x": data["x"][i:i + 10], "target": data["target"][i:i + 10]} for i in (0, 10)]
    trainer = build(batches)
    trainer.run()
    assert trainer.global_forward_batches == 2


# ---------------------------------------------------------------- resume_from="last" / True, fit() and train()
def test_resume_from_last_names_latest_and_latest_works(tmp_path):
    callbacks = [CheckpointCallback(tmp_path / "ckpt", every_n_batches=4, save_last=False)]
    with pytest.raises(ConfigurationError, match=r"resume_from='last' is not a folder here.*Did you mean "
                                                 r"resume_from='latest'"):
        make_trainer(callbacks).run(resume_from="last")
    make_trainer([CheckpointCallback(tmp_path / "ckpt", every_n_batches=4, save_last=False)]).run(
        resume_from="latest")


def test_resume_from_true_means_latest(tmp_path):
    def trainer():
        seed_everything(0)
        return make_trainer([CheckpointCallback(tmp_path / "ckpt", every_n_batches=4, save_last=False)], n_epochs=2)

    first = trainer()
    stop_after(first, 10)
    with pytest.raises(CallbackError):
        first.run(resume_from=True)  # nothing yet: a fresh start, as with "latest"
    resumed = trainer()
    resumed.run(resume_from=True)
    assert resumed._resumed is not None and resumed.global_forward_batches == 26
    trainer().run(resume_from=False)  # HF's "do not resume"


def test_resume_from_of_another_type_is_refused():
    with pytest.raises(ConfigurationError, match=r"resume_from=3 is not accepted; pass a checkpoint folder"):
        make_trainer().run(resume_from=3)


@pytest.mark.parametrize("method", ["fit", "train"])
def test_fit_and_train_name_run(method):
    trainer = build(ArrayLoader(make_classification(), batch_size=10))
    with pytest.raises(AttributeError, match=rf"'Trainer' object has no attribute '{method}'; drivetrain's "
                                             r"Trainer trains with trainer.run\(\)"):
        getattr(trainer, method)()
    assert not hasattr(trainer, method)
    with pytest.raises(AttributeError, match=r"no attribute 'evalute'.*Did you mean 'evaluate'"):
        trainer.evalute()
    trainer.run()


# --------------------------------------------------------------- precision="16-mixed" and monitor="accuracy"
@pytest.mark.parametrize(("given", "meant"), [("16-mixed", "fp16"), ("bf16-mixed", "bf16"), ("32-true", "fp32"),
                                              ("fp16", "fp16")])
def test_lightning_precisions_are_aliases(given, meant):
    assert resolve_precision(False, given) == meant


def test_an_unknown_precision_says_what_is_accepted_and_the_closest():
    with pytest.raises(ConfigurationError, match=r"precision='bf16_mixed' is not accepted; use one of \['fp32', "
                                                 r"'fp16', 'bf16'\] \(or Lightning's '16-mixed', 'bf16-mixed', "
                                                 r"'32-true'\). Did you mean 'bf16-mixed'\?"):
        resolve_precision(False, "bf16_mixed")


def test_monitor_accuracy_suggests_the_full_key_and_the_suggestion_runs():
    train = ArrayLoader(make_classification(), batch_size=10)
    dev = {"dev": ArrayLoader(make_classification(seed=1), batch_size=32)}
    with pytest.raises(ConfigurationError, match=r"monitor='accuracy' names no single metric result.*Did you mean "
                                                 r"'acc#acc#dev'\?"):
        build(train, metrics={"acc": Accuracy()}, evaluate_dataloaders=dev, monitor="accuracy")
    with pytest.raises(ConfigurationError, match=r"Did you mean 'acc#acc#dev'\?"):
        build(train, metrics={"acc": Accuracy()}, evaluate_dataloaders=dev, monitor="acc",
              callbacks=[EarlyStopCallback(monitor="accuracy")])
    trainer = build(train, metrics={"acc": Accuracy()}, evaluate_dataloaders=dev, monitor="acc#acc#dev")
    trainer.run()
    assert trainer.monitor_value(trainer.evaluate()) > 0.5
