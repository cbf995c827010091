"""Progress displays driven by a fake trainer through the real callback dispatcher."""

from __future__ import annotations

import io
import re
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
from rich.console import Console

from drivetrain._callbacks.base import Callback, CallbackManager
from drivetrain._common.errors import ConfigurationError, EarlyStopException
from drivetrain._progress import (
    ProgressCallback,
    RawTextProgress,
    RichProgress,
    TqdmProgress,
    choose_progress,
)
from drivetrain._progress.base import format_results, format_seconds, format_value


class CountingDriver:
    """Driver stub whose tensor_to_numpy counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def tensor_to_numpy(self, tensor):
        self.calls += 1
        return np.asarray(tensor)


def make_trainer(n_epochs: int = 2, per_epoch: int = 7, known_len: bool = True) -> SimpleNamespace:
    return SimpleNamespace(
        cur_epoch_idx=0,
        n_epochs=n_epochs,
        batch_idx_in_epoch=0,
        num_batches_per_epoch=per_epoch if known_len else None,
        global_forward_batches=0,
        n_batches=n_epochs * per_epoch if known_len else None,
        driver=CountingDriver(),
        per_epoch=per_epoch,
    )


def reached_n_batches(trainer) -> bool:
    return trainer.n_batches is not None and trainer.global_forward_batches >= trainer.n_batches


def batch_bounded_trainer() -> SimpleNamespace:
    """An iterable without len and n_batches=5: the Trainer then sets a huge n_epochs sentinel."""
    trainer = make_trainer(n_epochs=2**62, per_epoch=3, known_len=False)
    trainer.n_batches = 5
    return trainer


def run_fake_training(callback, trainer, *, evaluate_every=None, results=None, fail_at=None, error=None):
    """Fire the events in the Trainer's order; losses are 0-d arrays (framework-tensor stand-ins).

    At batch ``fail_at`` ``error`` (default ``RuntimeError("boom")``) is raised; like the Trainer,
    on_exception then on_train_end fire.
    """
    manager = CallbackManager()
    manager.add_callback(callback)
    fire = manager.fire
    try:
        fire("on_train_begin", trainer)
        while trainer.cur_epoch_idx < trainer.n_epochs and not reached_n_batches(trainer):
            trainer.batch_idx_in_epoch = 0
            fire("on_train_epoch_begin", trainer)
            for _ in range(trainer.per_epoch):
                if reached_n_batches(trainer):
                    break
                if trainer.global_forward_batches == fail_at:
                    raise RuntimeError("boom") if error is None else error
                fire("on_train_batch_begin", trainer, {"x": 1}, None)
                loss = np.array(1.0 / (trainer.global_forward_batches + 1))
                fire("on_before_backward", trainer, {"loss": loss, "pred": np.zeros(3)})
                fire("on_after_backward", trainer)
                trainer.batch_idx_in_epoch += 1
                trainer.global_forward_batches += 1
                fire("on_train_batch_end", trainer)
                if evaluate_every and trainer.global_forward_batches % evaluate_every == 0:
                    fire("on_evaluate_begin", trainer)
                    fire("on_evaluate_end", trainer, results)
            trainer.cur_epoch_idx += 1
            fire("on_train_epoch_end", trainer)
    except BaseException as exc:
        fire("on_exception", trainer, exc)
    finally:
        fire("on_train_end", trainer)


# ------------------------------------------------------------------------ raw
def test_raw_prints_every_n_batches_and_at_epoch_end(capsys):
    trainer = make_trainer(n_epochs=2, per_epoch=7)
    run_fake_training(RawTextProgress(print_every=3), trainer)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "training: 2 epochs, 7 batches per epoch"
    batch_lines = [line for line in lines if line.startswith("epoch")]
    assert [re.search(r"batch (\d+)/7", line).group(1) for line in batch_lines] == ["3", "6", "7"] * 2
    assert batch_lines[0] == "epoch 1/2  batch 3/7  step 3/14  loss 0.3333"
    assert batch_lines[-1] == "epoch 2/2  batch 7/7  step 14/14  loss 0.07143"
    assert re.fullmatch(r"training finished: 14 steps in \d+\.\d s; last loss 0\.07143", lines[-1]), lines[-1]


def test_loss_is_converted_only_when_the_display_refreshes(capsys):
    trainer = make_trainer(n_epochs=2, per_epoch=7)
    progress = RawTextProgress(print_every=3)
    run_fake_training(progress, trainer)
    assert trainer.driver.calls == 6  # batches 3, 6, 7 of each epoch; the summary reuses the last value


def test_before_backward_only_stores_a_reference():
    trainer = make_trainer()
    progress = RawTextProgress()
    loss = np.array(0.25)
    progress.on_before_backward(trainer, {"loss": loss})
    assert trainer.driver.calls == 0
    assert progress._loss is loss


def test_python_float_loss_skips_the_driver(capsys):
    trainer = make_trainer(n_epochs=1, per_epoch=1)
    progress = RawTextProgress(print_every=1)
    progress.on_train_begin(trainer)
    progress.on_before_backward(trainer, {"loss": 0.5})
    trainer.batch_idx_in_epoch = trainer.global_forward_batches = 1
    progress.on_train_batch_end(trainer)
    assert trainer.driver.calls == 0
    assert "loss 0.5" in capsys.readouterr().out


def test_raw_unknown_length_shows_the_epoch_end(capsys):
    trainer = make_trainer(n_epochs=2, per_epoch=7, known_len=False)
    run_fake_training(RawTextProgress(print_every=3), trainer)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "training: 2 epochs"
    batch_lines = [line for line in lines if line.startswith("epoch")]
    assert batch_lines[:3] == [
        "epoch 1/2  batch 3  step 3  loss 0.3333",
        "epoch 1/2  batch 6  step 6  loss 0.1667",
        "epoch 1/2  batch 7  step 7  loss 0.1429",  # printed at on_train_epoch_end, still epoch 1
    ]
    assert len(batch_lines) == 6


def test_raw_batch_bounded_training_hides_the_epoch_sentinel(capsys):
    trainer = batch_bounded_trainer()
    run_fake_training(RawTextProgress(print_every=2), trainer)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "training: 5 batches in all"
    assert [line for line in lines if line.startswith("epoch")] == [
        "epoch 1  batch 2  step 2/5  loss 0.5",
        "epoch 1  batch 3  step 3/5  loss 0.3333",
        "epoch 2  batch 2  step 5/5  loss 0.2",
    ]


def test_raw_shows_evaluation_results(capsys):
    trainer = make_trainer(n_epochs=1, per_epoch=4)
    results = {"acc#acc#dev": 0.931234, "f#fpr#dev": np.float32(0.5), "n#count#dev": 12}
    run_fake_training(RawTextProgress(print_every=10), trainer, evaluate_every=2, results=results)
    lines = capsys.readouterr().out.splitlines()
    evals = [line for line in lines if line.startswith("evaluation")]
    assert evals == [
        "evaluation at step 2: acc#acc#dev=0.9312, f#fpr#dev=0.5, n#count#dev=12",
        "evaluation at step 4: acc#acc#dev=0.9312, f#fpr#dev=0.5, n#count#dev=12",
    ]
    assert lines[-1].endswith("last evaluation acc#acc#dev=0.9312, f#fpr#dev=0.5, n#count#dev=12")


def test_raw_exception_ends_with_what_stopped_training(capsys):
    trainer = make_trainer(n_epochs=2, per_epoch=5)
    run_fake_training(RawTextProgress(print_every=2), trainer, fail_at=7)
    out = capsys.readouterr().out
    assert re.fullmatch(r"training stopped at step 7 \(epoch 2\) by RuntimeError: boom; after \d+\.\d s; "
                        r"last loss 0\.1429", out.splitlines()[-1]), out
    assert "finished" not in out


@pytest.mark.parametrize(("error", "expected"), [
    (KeyboardInterrupt(), "training stopped at step 3 (epoch 1) by KeyboardInterrupt; after "),
    (EarlyStopException("no improvement in 3 evaluations"),
     "training stopped early at step 3 (epoch 1): no improvement in 3 evaluations; after "),
    (ValueError("first line\nsecond line"), "training stopped at step 3 (epoch 1) by ValueError: first line ...; after "),
])
@pytest.mark.parametrize("cls", [RawTextProgress, RichProgress, TqdmProgress])
def test_every_display_says_what_stopped_training(cls, error, expected):
    stream = io.StringIO()
    if cls is RichProgress:
        progress = cls(console=Console(file=stream, width=300, color_system=None))
    else:
        progress = cls(file=stream)
    run_fake_training(progress, make_trainer(n_epochs=2, per_epoch=5), fail_at=3, error=error)
    summary = stream.getvalue().splitlines()[-1]
    assert summary.startswith(expected), summary
    assert "finished" not in stream.getvalue()


def test_a_failure_between_epochs_names_the_epoch_just_completed(capsys):
    trainer = make_trainer(n_epochs=3, per_epoch=4)
    progress = RawTextProgress(print_every=100)
    manager = CallbackManager()
    manager.add_callback(progress)
    manager.fire("on_train_begin", trainer)
    for _ in range(2):  # two complete epochs; the Trainer counts cur_epoch_idx up before on_train_epoch_end
        manager.fire("on_train_epoch_begin", trainer)
        trainer.batch_idx_in_epoch, trainer.global_forward_batches = 4, trainer.global_forward_batches + 4
        trainer.cur_epoch_idx += 1
        manager.fire("on_train_epoch_end", trainer)
    manager.fire("on_exception", trainer, RuntimeError("evaluation failed"))
    manager.fire("on_train_end", trainer)
    summary = capsys.readouterr().out.splitlines()[-1]
    assert summary.startswith("training stopped at step 8 (epoch 2) by RuntimeError: evaluation failed"), summary


def test_a_failure_before_training_began_has_no_duration(capsys):
    progress = RawTextProgress()
    manager = CallbackManager()
    manager.add_callback(progress)
    manager.fire("on_exception", make_trainer(), RuntimeError("sanity check failed"))
    manager.fire("on_train_end", make_trainer())
    assert capsys.readouterr().out == "training stopped at step 0 (epoch 1) by RuntimeError: sanity check failed\n"


def test_the_next_run_of_a_reused_display_finishes_honestly(capsys):
    progress = RawTextProgress(print_every=100)
    run_fake_training(progress, make_trainer(n_epochs=1, per_epoch=3), fail_at=1)
    run_fake_training(progress, make_trainer(n_epochs=1, per_epoch=3))
    assert capsys.readouterr().out.splitlines()[-1].startswith("training finished: 3 steps in ")


@pytest.mark.parametrize(("seconds", "shown"), [
    (0.0, "0.0 s"), (0.04, "0.0 s"), (3.25, "3.2 s"), (12.44, "12.4 s"), (59.94, "59.9 s"),
    (59.96, "1:00"), (75.4, "1:15"), (3599.6, "1:00:00"), (3725, "1:02:05"), (90061, "25:01:01"),
])
def test_durations(seconds, shown):
    assert format_seconds(seconds) == shown


# ----------------------------------------------------------------------- rich
def rich_console() -> tuple[Console, io.StringIO]:
    buffer = io.StringIO()
    return Console(file=buffer, force_terminal=True, width=140, color_system=None), buffer


def test_rich_bars_loss_and_results():
    console, buffer = rich_console()
    trainer = make_trainer(n_epochs=2, per_epoch=6)
    progress = RichProgress(print_every=2, console=console)
    run_fake_training(progress, trainer, evaluate_every=6, results={"acc#acc#dev": 0.87654})
    out = buffer.getvalue()
    assert "epochs" in out and "epoch 2" in out
    assert "2/2" in out and "6/6" in out
    assert "loss 0.08333" in out  # last batch (12) loss 1/12
    assert "evaluation at step 6: acc#acc#dev=0.8765" in out
    assert re.search(r"training finished: 12 steps in \d+\.\d s; last loss 0\.08333; last evaluation "
                     r"acc#acc#dev=0\.8765", out)
    assert trainer.driver.calls == 6  # every 2nd batch of two 6-batch epochs
    assert progress._progress is None


def test_rich_stops_the_live_display_on_exception():
    console, buffer = rich_console()
    trainer = make_trainer(n_epochs=2, per_epoch=5)
    progress = RichProgress(console=console)
    run_fake_training(progress, trainer, fail_at=3)
    assert progress._progress is None
    # The console is free again: a new live display can start and stop.
    again = RichProgress(console=console)
    again.on_train_begin(trainer)
    assert again._progress.live.is_started
    again.on_exception(trainer, RuntimeError("x"))
    assert again._progress is None
    assert "training stopped at step 3 (epoch 1) by RuntimeError: boom; after " in buffer.getvalue()


def test_rich_and_tqdm_batch_bounded_training():
    console, buffer = rich_console()
    run_fake_training(RichProgress(console=console), batch_bounded_trainer())
    assert "4611686018427387904" not in buffer.getvalue()
    assert "training finished: 5 steps" in buffer.getvalue()
    stream = io.StringIO()
    run_fake_training(TqdmProgress(file=stream), batch_bounded_trainer())
    assert "4611686018427387904" not in stream.getvalue()
    assert "epoch 2" in stream.getvalue()


def test_rich_leave_false_is_transient():
    console, _ = rich_console()
    progress = RichProgress(leave=False, console=console)
    trainer = make_trainer(n_epochs=1, per_epoch=2)
    progress.on_train_begin(trainer)
    assert progress._progress.live.transient
    progress.on_train_end(trainer)


def test_rich_display_draws_a_task_added_without_info():
    """An evaluation adds its own task (no loss/results text) to the trainer's live display."""
    console, buffer = rich_console()
    progress = RichProgress(console=console)
    trainer = make_trainer(n_epochs=1, per_epoch=2)
    progress.on_train_begin(trainer)
    progress._progress.add_task("evaluate dev", total=3)
    progress.on_train_end(trainer)
    assert "evaluate dev" in buffer.getvalue()


def test_rich_results_before_training_print_plainly():
    console, buffer = rich_console()
    RichProgress(console=console).on_evaluate_end(make_trainer(), {"acc": 0.5})
    assert "evaluation at step 0: acc=0.5" in buffer.getvalue()


# ----------------------------------------------------------------------- tqdm
def test_tqdm_bar_and_results(capsys):
    trainer = make_trainer(n_epochs=2, per_epoch=4)
    run_fake_training(TqdmProgress(print_every=2), trainer, evaluate_every=4, results={"acc#acc#dev": 0.123456})
    captured = capsys.readouterr()
    bars, out = captured.err, captured.out  # tqdm's default: bars on stderr, messages on stdout
    assert "epoch 1/2" in bars and "epoch 2/2" in bars
    assert "4/4" in bars and "loss=0.125" in bars
    assert "evaluation at step 4: acc#acc#dev=0.1235" in out
    assert "training finished: 8 steps" in out
    assert trainer.driver.calls == 4


def test_tqdm_file_gets_bars_and_messages_and_closes_on_exception():
    trainer = make_trainer(n_epochs=2, per_epoch=4)
    stream = io.StringIO()
    progress = TqdmProgress(file=stream)
    run_fake_training(progress, trainer, fail_at=2)
    assert progress._bar is None
    assert "2/4" in stream.getvalue()
    assert "training stopped at step 2 (epoch 1) by RuntimeError: boom; after " in stream.getvalue()


def test_tqdm_missing_gives_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)
    with pytest.raises(ConfigurationError, match="pip install tqdm"):
        TqdmProgress()
    with pytest.raises(ConfigurationError, match="pip install tqdm"):
        choose_progress("tqdm")


def test_module_imports_without_tqdm():
    code = (
        "import sys; sys.modules['tqdm'] = None\n"
        "import drivetrain._progress, drivetrain._progress.tqdm_bar\n"
        "assert sys.modules['tqdm'] is None\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# --------------------------------------------------------------------- common
@pytest.mark.parametrize("cls", [RawTextProgress, RichProgress, TqdmProgress])
@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "10"])
def test_print_every_is_validated(cls, bad):
    with pytest.raises(ConfigurationError, match=f"print_every={bad!r}.*int >= 1"):
        cls(print_every=bad)


@pytest.mark.parametrize("cls", [RawTextProgress, RichProgress, TqdmProgress])
def test_progress_runs_on_global_zero_only(cls):
    manager = CallbackManager(is_global_zero=False)
    manager.add_callback(cls())
    assert not any(manager.handlers.values())
    assert cls.rank_zero_only


def test_format_helpers():
    assert format_value(0.000123456) == "0.0001235"
    assert format_value(np.float64(12345.678)) == "1.235e+04"
    assert format_value(np.int64(7)) == "7"
    assert format_value(np.array(0.5)) == "0.5"
    assert format_value(True) == "True"
    assert format_value("text") == "text"
    assert format_results({"a": 1.0, "b": 2}) == "a=1, b=2"


# -------------------------------------------------------------- choose_progress
class FakeStdout(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


@pytest.mark.parametrize(
    ("tty", "ci", "expected"),
    [
        (True, None, RichProgress),
        (True, "true", RawTextProgress),
        (True, "1", RawTextProgress),
        (True, "false", RichProgress),
        (False, None, RawTextProgress),
    ],
)
def test_choose_auto(monkeypatch, tty, ci, expected):
    monkeypatch.setattr(sys, "stdout", FakeStdout(tty))
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    assert type(choose_progress("auto")) is expected


def test_choose_named_and_none():
    assert type(choose_progress("raw")) is RawTextProgress
    assert type(choose_progress("rich")) is RichProgress
    assert type(choose_progress("tqdm")) is TqdmProgress
    assert type(choose_progress("Rich")) is RichProgress
    for off in (None, False, "none"):
        assert choose_progress(off) is None
    mine = RawTextProgress(print_every=5)
    assert choose_progress(mine) is mine

    class OwnBar(Callback):
        pass

    own = OwnBar()
    assert choose_progress(own) is own
    assert isinstance(mine, ProgressCallback)


@pytest.mark.parametrize("bad", ["fancy", True, 3, object(), ""])
def test_choose_rejects_everything_else(bad):
    with pytest.raises(ConfigurationError, match="progress_bar=.*'auto', 'rich', 'raw', 'tqdm', 'none'"):
        choose_progress(bad)
