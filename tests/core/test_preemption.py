"""A preemption signal ends training at a step boundary with a checkpoint that resumes exactly.

One process here, on the numpy driver; the same callback under a real Slurm (``scancel --signal=USR1``,
requeue, several ranks) is in the process tests.
"""

from __future__ import annotations

import json
import os
import signal

import numpy as np
import pytest

from drivetrain import Callback, CheckpointCallback, ConfigurationError, PreemptionCallback, Trainer

from .conftest import drivetrain_numpy, make_regression


class SignalAt(Callback):
    """Sends ``signum`` to this process when batch ``step`` ends (as Slurm's --signal would, at any moment)."""

    def __init__(self, step: int, signum: int = signal.SIGUSR1) -> None:
        self.step, self.signum = step, signum

    def on_train_batch_end(self, trainer) -> None:
        if trainer.global_forward_batches == self.step:
            os.kill(os.getpid(), self.signum)


def _trainer(tmp_path, callbacks=(), **kwargs):
    model = drivetrain_numpy.LinearModel(3, 1)
    opt = drivetrain_numpy.SGD(model.params, model.grads, lr=0.05)
    loader = drivetrain_numpy.ArrayLoader(make_regression(n=64, seed=3), batch_size=8, shuffle=True)
    keeper = CheckpointCallback(tmp_path / "ckpt", every_n_epochs=1)
    trainer = Trainer(model, loader, opt, driver="numpy", n_epochs=3, progress_bar=None,
                      callbacks=[keeper, *callbacks], loggers=["jsonl"], run_dir=str(tmp_path / "run"),
                      **kwargs)
    return trainer, model


@pytest.fixture
def no_slurm(monkeypatch):
    for name in [n for n in os.environ if n.startswith("SLURM_")]:
        monkeypatch.delenv(name)
    return monkeypatch


def test_the_signal_stops_at_the_step_saves_and_the_resume_is_bit_exact(tmp_path, no_slurm) -> None:
    unbroken, model = _trainer(tmp_path / "a")
    unbroken.run()
    expected = {k: v.copy() for k, v in model.params.items()}

    preemption = PreemptionCallback(requeue=False)
    first, _ = _trainer(tmp_path / "b", [SignalAt(11), preemption])
    first.run()
    assert first.global_forward_batches == 11 and preemption.preempted
    summary = json.loads((tmp_path / "b" / "run" / "summary.json").read_text())
    assert summary["status"] == "preempted" and summary["step"] == 11
    manifest = json.loads((tmp_path / "b" / "ckpt" / "last" / "manifest.json").read_text())
    assert manifest["trainer"]["ended"] is None and manifest["trainer"]["global_forward_batches"] == 11
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL  # the handler is put back

    second, model = _trainer(tmp_path / "b")
    second.run(resume_from="latest")
    assert second.global_forward_batches == 24
    for name in expected:
        np.testing.assert_array_equal(model.params[name], expected[name])


def test_without_save_last_the_stop_writes_a_periodic_checkpoint(tmp_path, no_slurm) -> None:
    model = drivetrain_numpy.LinearModel(3, 1)
    opt = drivetrain_numpy.SGD(model.params, model.grads, lr=0.05)
    loader = drivetrain_numpy.ArrayLoader(make_regression(n=64), batch_size=8)
    keeper = CheckpointCallback(tmp_path, every_n_epochs=5, save_last=False)
    Trainer(model, loader, opt, driver="numpy", n_epochs=2, progress_bar=None,
            callbacks=[SignalAt(5), keeper, PreemptionCallback(requeue=False)]).run()
    assert sorted(os.listdir(tmp_path)) == ["step_00000005-epoch_0-batch_5"]


def test_under_slurm_a_run_with_checkpoints_gets_the_callback_and_one_without_keeps_the_default(
        tmp_path, no_slurm) -> None:
    no_slurm.setenv("SLURM_JOB_ID", "99")
    trainer, _ = _trainer(tmp_path)
    added = [cb for cb in trainer.callbacks if isinstance(cb, PreemptionCallback)]
    assert len(added) == 1 and trainer.callbacks[-1] is added[0]  # last: after the checkpoint is written
    model = drivetrain_numpy.LinearModel(3, 1)
    opt = drivetrain_numpy.SGD(model.params, model.grads, lr=0.05)
    bare = Trainer(model, drivetrain_numpy.ArrayLoader(make_regression(), batch_size=8), opt, driver="numpy",
                   progress_bar=None)
    assert not any(isinstance(cb, PreemptionCallback) for cb in bare.callbacks)
    no_slurm.delenv("SLURM_JOB_ID")
    trainer, _ = _trainer(tmp_path)
    assert not any(isinstance(cb, PreemptionCallback) for cb in trainer.callbacks)


def test_a_users_callback_is_moved_last_and_its_signal_is_used(tmp_path, no_slurm) -> None:
    mine = PreemptionCallback("USR2", requeue=False)
    trainer, _ = _trainer(tmp_path, [mine, SignalAt(3, signal.SIGUSR2)])
    assert trainer.callbacks[-1] is mine
    trainer.run()
    assert trainer.global_forward_batches == 3


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"signal": "SIGNOPE"}, r"signal='SIGNOPE'\) is not a signal"),
    ({"requeue": "yes"}, r"requeue='yes'"),
    ({"check_every_n_batches": 0}, r"check_every_n_batches=0"),
])
def test_bad_arguments_name_the_fix(kwargs, match) -> None:
    with pytest.raises(ConfigurationError, match=match):
        PreemptionCallback(**kwargs)
