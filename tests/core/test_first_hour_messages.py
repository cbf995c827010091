"""The errors a newcomer meets in the first hour, through the public API with the numpy driver, and their fixes."""

from __future__ import annotations

import inspect
import logging
import os
import subprocess
import sys
import textwrap

import pytest

import drivetrain
import drivetrain.loggers
from drivetrain import (
    Accuracy,
    BatchMismatchError,
    Callback,
    CheckpointCallback,
    CheckpointError,
    ConfigurationError,
    DriverNotFoundError,
    DriverSpec,
    EarlyStopCallback,
    Trainer,
    hookimpl,
)
from drivetrain.backend._plugins import reset_registry, resolve_spec
from drivetrain_numpy import SGD, ArrayLoader, LinearModel

from .conftest import make_classification, make_regression


def build(**overrides) -> Trainer:
    model = overrides.pop("model", None) or LinearModel(4, 3, loss="ce")
    train = overrides.pop("train", None) or ArrayLoader(make_classification(), batch_size=10)
    overrides.setdefault("driver", "numpy")
    return Trainer(model, train, SGD(model.params, model.grads, lr=0.5), progress_bar=None, **overrides)


# ------------------------------------------- 2. a full monitor key naming a dataloader that is not there
def test_a_misspelt_dataloader_in_a_full_monitor_key_fails_at_construction_with_the_closest_name():
    dev = ArrayLoader(make_classification(seed=1), batch_size=16)
    loaders = {"dev": dev, "test": dev}
    with pytest.raises(ConfigurationError) as caught:
        build(metrics={"acc": Accuracy()}, evaluate_dataloaders=loaders, monitor="acc#acc#dve")
    message = str(caught.value)
    assert "monitor='acc#acc#dve' names the dataloader 'dve', which is not one of evaluate_dataloaders" in message
    assert "Did you mean 'dev'?" in message and "'acc#acc#dev'" in message
    # the suggestion is a key the evaluation produces: the run monitors it
    trainer = build(metrics={"acc": Accuracy()}, evaluate_dataloaders=loaders, monitor="acc#acc#dev", n_epochs=1)
    trainer.run()
    assert "acc#acc#dev" in trainer.evaluator.run()


def test_a_dataloader_part_for_a_single_unnamed_dataloader_says_how_to_name_it():
    dev = ArrayLoader(make_classification(seed=1), batch_size=16)
    with pytest.raises(ConfigurationError, match=r"monitor='acc#acc#dev' names the dataloader 'dev', but "
                       r"evaluate_dataloaders is a single dataloader without a name.*pass monitor='acc#acc', or "
                       r"name the dataloader: evaluate_dataloaders=\{'dev': dataloader\}"):
        build(metrics={"acc": Accuracy()}, evaluate_dataloaders=dev, monitor="acc#acc#dev")
    build(metrics={"acc": Accuracy()}, evaluate_dataloaders={"dev": dev}, monitor="acc#acc#dev")  # the fix
    build(metrics={"acc": Accuracy()}, evaluate_dataloaders=dev, monitor="acc#acc")  # the other fix


def test_a_callback_monitor_with_a_wrong_dataloader_is_refused_too():
    dev = ArrayLoader(make_classification(seed=1), batch_size=16)
    with pytest.raises(ConfigurationError, match=r"names the dataloader 'tset'.*Did you mean 'test'\?"):
        build(metrics={"acc": Accuracy()}, evaluate_dataloaders={"dev": dev, "test": dev}, monitor="acc",
              callbacks=[EarlyStopCallback(monitor="acc#acc#tset")])


# ------------------------------------------------- 3. misspelt keywords of the public callbacks and loggers
def _public_classes() -> list[type]:
    found = []
    for module in (drivetrain, drivetrain.loggers):
        for name in module.__all__:
            obj = getattr(module, name)
            if isinstance(obj, type) and issubclass(obj, (Callback, drivetrain.loggers.Logger)) and obj is not Callback:
                found.append(obj)
    return found


def test_checkpoint_callback_every_n_epoch_suggests_every_n_epochs(tmp_path):
    with pytest.raises(ConfigurationError, match=r"CheckpointCallback got unexpected argument\(s\) \['every_n_epoch'\] "
                       r"\(every_n_epoch: did you mean every_n_epochs=\?\)\. CheckpointCallback accepts folder, "):
        CheckpointCallback(tmp_path, every_n_epoch=1)
    CheckpointCallback(tmp_path, every_n_epochs=1)  # the suggestion works


@pytest.mark.parametrize("cls", _public_classes(), ids=lambda cls: cls.__name__)
def test_every_public_callback_and_logger_names_the_closest_keyword(cls):
    parameters = inspect.signature(cls).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        pytest.skip(f"{cls.__name__} passes other keywords on (WandbLogger's go to wandb.init)")
    names = [p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    assert names, f"{cls.__name__} takes no keyword to misspell"
    typo = names[-1] + "s"  # plural for singular or the reverse: the usual slip
    with pytest.raises(ConfigurationError, match=rf"{cls.__name__} got unexpected argument\(s\) \['{typo}'\] "
                       rf"\({typo}: did you mean {names[-1]}=\?\)"):
        cls(**{typo: None})


def test_a_users_own_subclasses_keep_working():
    class Mine(Callback):
        def __init__(self, a, **extra):
            self.a, self.extra = a, extra

    assert Mine(1, anything=2).extra == {"anything": 2}

    class MyCheckpoints(CheckpointCallback):
        def __init__(self, folder, note="x", **options):
            super().__init__(folder, **options)
            self.note = note

    made = MyCheckpoints("ckpt", note="y", every_n_epochs=2)
    assert made.note == "y"
    with pytest.raises(ConfigurationError, match=r"CheckpointCallback got unexpected argument\(s\) \['topkk'\]"):
        MyCheckpoints("ckpt", topkk=1)

    class Periodic(CheckpointCallback):  # inherits CheckpointCallback's __init__: named by its own name
        pass

    with pytest.raises(ConfigurationError, match=r"Periodic got unexpected argument\(s\) \['every_n_epoch'\] "
                       r"\(every_n_epoch: did you mean every_n_epochs=\?\)\. Periodic accepts folder, "):
        Periodic("ckpt", every_n_epoch=1)

    class Inherited(EarlyStopCallback):
        pass

    assert Inherited(patience=2) is not None
    with pytest.raises(ConfigurationError, match=r"did you mean patience=\?"):
        Inherited(patiense=2)


# ------------------------------------------------------- 4. the batch the model cannot take (numpy driver)
class _OneArgument(LinearModel):
    def forward(self, x):  # takes the batch's x only: a (x, y) tuple batch reaches it whole
        return x @ self.params["weight"]


def test_a_tuple_batch_for_a_one_argument_forward_names_input_mapping():
    data = make_regression()
    batches = [(data["x"][i:i + 8], data["target"][i:i + 8]) for i in range(0, 64, 8)]
    model = _OneArgument(3, 1)
    with pytest.raises(BatchMismatchError) as caught:
        Trainer(model, batches, SGD(model.params, model.grads), driver="numpy", progress_bar=None).run()
    message = str(caught.value)
    assert "_OneArgument.forward() raised TypeError" in message
    assert "but _OneArgument.forward(x) takes one parameter, so it received the whole tuple as 'x'" in message
    assert "input_mapping=lambda batch: {'x': batch[0], 'target': batch[1]}" in message
    assert "The batch holds values" not in message  # numpy arrays are this driver's tensors


# ------------------------------------------------------------------ 5. a checkpoint folder that is not there
def test_loading_from_a_missing_folder_says_it_does_not_exist(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    trainer = build()
    for load in (trainer.load_model, trainer.load_checkpoint):
        with pytest.raises(CheckpointError) as caught:
            load("missing-folder")
        message = str(caught.value)
        assert f"{tmp_path / 'missing-folder'} does not exist" in message
        assert f"current directory, {tmp_path}" in message and "manifest" not in message
    with pytest.raises(FileNotFoundError, match=r"resume_from=.*missing-folder' does not exist"):
        trainer.run(resume_from="missing-folder")
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(CheckpointError, match=r"a-file is a file, not a checkpoint folder"):
        trainer.load_checkpoint("a-file")
    saved = trainer.save_checkpoint("missing-folder")  # the fix: the folder save_checkpoint wrote
    trainer.load_checkpoint(saved)
    trainer.load_model(saved)


# ------------------------------------------------------- 6. a framework's root handler is not the app's
def test_a_framework_handler_on_the_root_logger_does_not_change_drivetrains_format():
    script = textwrap.dedent("""
        import logging
        fmt = "[%(asctime)s] [%(levelname)8s] FRAMEWORK - %(message)s"
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter(fmt))
        logging.getLogger().addHandler(handler)  # what a framework does at its import
        from drivetrain.backend import ignore_framework_log_format
        from drivetrain._common.log import configure
        ignore_framework_log_format(fmt)
        configure(None, is_global_zero=True)
        logging.getLogger("drivetrain").info("probe")
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                            env=dict(os.environ))
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == ["drivetrain: probe"]


def test_an_application_root_handler_still_gets_drivetrains_records(caplog):
    with caplog.at_level(logging.INFO, logger="drivetrain"):
        logging.getLogger("drivetrain").info("routed like the application's own")
    assert "routed like the application's own" in caplog.text


# --------------------------------------------- 7. drivers that are installed but cannot run are told apart
def test_the_unknown_driver_message_lists_only_drivers_that_can_run_and_what_the_others_miss():
    class WithMissingFramework:
        @hookimpl
        def drivetrain_driver_specs(self):
            return [DriverSpec(name="ghostspeed", framework="ghostspeed_not_installed", factory="x:y",
                               contract_versions=(1,), install="pip install ghostspeed")]

    try:
        drivetrain.register_plugin(WithMissingFramework(), name="ghostspeed-plugin")
        with pytest.raises(DriverNotFoundError) as caught:
            build(driver="nump")
        message = str(caught.value)
        # the ones that can run: numpy (and oneflow where the core suite runs in the oneflow env), not ghostspeed
        runnable = message.split("installed drivers: ", 1)[1].split(".", 1)[0].split(", ")
        assert "numpy" in runnable and "ghostspeed" not in runnable, message
        assert ("Driver 'ghostspeed' is installed too but cannot run: its framework module "
                "'ghostspeed_not_installed' is missing. To install it: pip install ghostspeed.") in message
        assert "Did you mean 'numpy'?" in message
        with pytest.raises(DriverNotFoundError, match=r"driver='auto' found no installed driver .*installed drivers: "
                           r"numpy(, oneflow)?\. Driver 'ghostspeed' is installed too but cannot run"):
            resolve_spec("auto", object())
    finally:
        reset_registry()


# ------------------------------------------------- 8. install commands that work before drivetrain is on PyPI
def test_install_hints_put_the_command_that_works_from_a_checkout_first(monkeypatch):
    from drivetrain._records.plot import INSTALL as PLOT
    from drivetrain.loggers import TensorBoardLogger

    assert PLOT.startswith("pip install matplotlib ")
    monkeypatch.setitem(sys.modules, "tensorboardX", None)
    with pytest.raises(ConfigurationError, match=r"needs tensorboardX, which is not installed: pip install "
                       r"tensorboardX \(or, from a drivetrain checkout, pip install -e \"\.\[tensorboard\]\"\)"):
        TensorBoardLogger()
    with pytest.raises(DriverNotFoundError) as caught:
        build(driver="jittor")
    message = str(caught.value)
    assert message.index("pip install -c constraints.txt -e . -e backends/jittor") < message.index("drivetrain[jittor]")
    assert "once drivetrain is published" in message

