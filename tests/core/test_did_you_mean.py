"""Misspelt names get the closest accepted name: arguments, events, callback methods, monitors, the CLI."""

from __future__ import annotations

import copy
import pickle
import subprocess
import sys

import pytest

import drivetrain
from drivetrain import Accuracy, Callback, ConfigurationError, Evaluator, Event, Trainer
from drivetrain._cli import main
from drivetrain._common.options import parameter_names, unknown_arguments_error
from drivetrain_numpy import SGD, ArrayLoader, LinearModel

from .conftest import make_classification, make_regression


# ------------------------------------------------------------- unknown arguments
def test_unknown_arguments_error_names_each_argument_and_its_closest_accepted_name():
    accepted = parameter_names(Trainer.__init__)
    err = unknown_arguments_error("Trainer", {"n_epoch", "zzz"}, accepted, hint="Framework options go in torch_kwargs.")
    assert isinstance(err, ConfigurationError)
    assert str(err) == ("Trainer got unexpected argument(s) ['n_epoch', 'zzz'] (n_epoch: did you mean n_epochs=?; "
                        "zzz: no accepted argument is close). Framework options go in torch_kwargs.")


def test_unknown_arguments_error_for_the_evaluator_and_without_a_hint():
    err = unknown_arguments_error("Evaluator", ["verbos"], parameter_names(Evaluator.__init__))
    assert str(err) == "Evaluator got unexpected argument(s) ['verbos'] (verbos: did you mean verbose=?)."


def test_the_evaluator_never_suggests_its_internal_argument():
    model = LinearModel(4, 3)
    with pytest.raises(ConfigurationError, match=r"argument_names: no accepted argument is close.*torch_kwargs") as info:
        Evaluator(model, ArrayLoader(make_classification()), {"acc": Accuracy()}, driver="numpy", argument_names=1)
    assert "_argument_names" not in str(info.value)


def test_parameter_names_leave_out_self_and_the_catch_alls():
    def fn(self, a, b=1, *args, c, **kwargs):
        return None

    assert parameter_names(fn) == ["a", "b", "c"]
    names = parameter_names(Trainer.__init__)
    assert "n_epochs" in names and "self" not in names and "kwargs" not in names


# ----------------------------------------------------------------------- events
def test_an_unknown_event_is_a_configuration_error_listing_the_events():
    with pytest.raises(ConfigurationError, match=r"Event.on_trian_begin: 'on_trian_begin' is not an event. "
                                                 r"Did you mean 'on_train_begin'.*Events: on_after_trainer_initialized, "):
        Event.on_trian_begin()
    with pytest.raises(ConfigurationError, match=r"Event.on_foo: 'on_foo' is not an event. Events: "):
        Event.on_foo()
    with pytest.raises(ConfigurationError, match=r"Event.train_begin: .*Did you mean 'on_train_begin'"):
        Event.train_begin  # noqa: B018 - the attribute access itself must fail
    with pytest.raises(ConfigurationError, match=r"Event\('on_epoch_end'\): .*Did you mean 'on_train_epoch_end'"):
        Event("on_epoch_end")
    with pytest.raises(ConfigurationError, match=r"Event\(3\): 3 is not an event"):
        Event(3)


def test_private_names_on_event_keep_attribute_error_so_copy_and_pickle_work():
    assert not hasattr(Event, "__wrapped__")
    assert not hasattr(Event, "_private")
    assert getattr(Event, "__no_such_dunder__", "default") == "default"
    event = Event.on_train_batch_end(every=3)
    assert pickle.loads(pickle.dumps(event)) == event
    assert copy.deepcopy(event) == event and copy.copy(event) == event
    assert pickle.loads(pickle.dumps(Event)) is Event


# ----------------------------------------------------------- callback methods
def build(**overrides) -> Trainer:
    model = LinearModel(3, 1)
    return Trainer(model, ArrayLoader(make_regression()), SGD(model.params, model.grads), driver="numpy",
                   progress_bar=None, **overrides)


@pytest.mark.parametrize(("method", "suggested"), [
    ("on_epoch_end", "on_train_epoch_end"),
    ("on_train_epoch_ends", "on_train_epoch_end"),
    ("on_trian_begin", "on_train_begin"),
])
def test_a_callback_method_named_like_no_event_is_refused_when_the_trainer_is_built(method, suggested):
    misnamed = type("Misnamed", (Callback,), {method: lambda self, trainer: None})
    with pytest.raises(ConfigurationError, match=rf"callbacks: Misnamed.{method} would never be called: '{method}' "
                                                 rf"is not an event. Did you mean '{suggested}'"):
        build(callbacks=[misnamed()])


def test_a_misnamed_method_is_refused_on_every_rank():
    from drivetrain._callbacks.base import CallbackManager

    class Progressish(Callback):
        rank_zero_only = True

        def on_epoch_end(self, trainer):
            pass

    with pytest.raises(ConfigurationError, match="Progressish.on_epoch_end would never be called"):
        CallbackManager(is_global_zero=False).add_callback(Progressish())


def test_event_methods_state_hooks_and_other_names_are_accepted():
    class Fine(Callback):
        on_gpu = True  # an attribute, not a method: nothing to call

        def on_train_epoch_end(self, trainer):
            pass

        def on_save_checkpoint(self, trainer):
            return {}

        def on_load_checkpoint(self, trainer, states):
            pass

        def log_epoch(self, trainer):
            pass

    assert any(isinstance(cb, Fine) for cb in build(callbacks=[Fine()]).callbacks)


# ------------------------------------------------------------------- monitor
def test_monitor_without_a_dataloader_follows_the_order_the_dataloaders_were_given():
    model = LinearModel(4, 3, loss="ce")
    loaders = {"test": ArrayLoader(make_classification(seed=2)), "dev": ArrayLoader(make_classification(seed=1))}
    trainer = Trainer(model, ArrayLoader(make_classification()), SGD(model.params, model.grads), driver="numpy",
                      progress_bar=None, metrics={"acc": Accuracy()}, evaluate_dataloaders=loaders, monitor="acc")
    results = trainer.evaluate()
    assert list(results) == ["acc#acc#test", "acc#acc#dev"]
    assert results["acc#acc#test"] != results["acc#acc#dev"]  # else the test could not tell the rule apart
    assert trainer.monitor_value(results) == results["acc#acc#test"]  # not 'dev', the alphabetically first
    assert trainer.monitor_value(results, "acc#acc#dev") == results["acc#acc#dev"]
    with pytest.raises(ConfigurationError, match=r"monitor='acc#acc#dve' matches no evaluation result; results are "
                                                 r"\['acc#acc#test', 'acc#acc#dev'\]. Did you mean 'acc#acc#dev'\?"):
        trainer.monitor_value(results, "acc#acc#dve")


def test_an_ambiguous_monitor_says_how_to_name_the_result_and_the_dataloader():
    from drivetrain._callbacks.monitor import find_monitor_value

    results = {"f#fpr#test": 0.1, "pre#fpr#test": 0.2, "f#fpr#dev": 0.3}
    with pytest.raises(ConfigurationError, match=r"it matches \['f#fpr#test', 'pre#fpr#test'\]. Pass one of these "
                                                 r"keys; a full key 'result#metric#dataloader' such as 'f#fpr#test'"):
        find_monitor_value(results, "fpr")


# ----------------------------------------------------------------------- CLI
def test_cli_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out == f"drivetrain {drivetrain.__version__}\n"


def test_python_m_drivetrain_runs_the_cli():
    result = subprocess.run([sys.executable, "-m", "drivetrain", "--version"], capture_output=True, text=True,
                            timeout=60, check=True)
    assert result.stdout == f"drivetrain {drivetrain.__version__}\n"


def test_cli_check_of_a_misspelt_backend_suggests_the_known_name(capsys):
    assert main(["backends", "--check", "tourch"]) == 2
    out = capsys.readouterr().out
    assert out.startswith("cannot check 'tourch': driver='tourch' is unknown; installed drivers: ")
    assert out.rstrip().endswith("Did you mean 'torch'?")


def test_cli_check_of_a_misspelt_installed_backend_suggests_it(capsys):
    assert main(["backends", "--check", "numpi"]) == 2
    out = capsys.readouterr().out
    assert "driver='numpi' is unknown; installed drivers: " in out and "Did you mean 'numpy'?" in out
