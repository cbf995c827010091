"""How a run ends, told truthfully: early stops reach every consumer, finished and early-stopped runs started
again train nothing, Ctrl-C and SIGTERM end the process non-zero after saving, the summary agrees with itself."""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from drivetrain import CheckpointCallback, EarlyStopCallback, Event, RawTextProgress

from .._signals import popen_interruptible, read_until
from ._callback_helpers import from_table, listing, make_trainer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def read_json(path):
    with open(path) as f:
        return json.load(f)


def early_stopping_trainer(tmp_path, patience=2, **kwargs):
    """Evaluations every 6 steps; the score peaks at step 6, so patience 2 stops the run at step 18."""
    table = {6: 0.9, 12: 0.8, 18: 0.7}
    callbacks = [EarlyStopCallback(monitor="score", patience=patience),
                 CheckpointCallback(tmp_path / "ckpt", every_n_epochs=1), *kwargs.pop("callbacks", [])]
    return make_trainer(callbacks, script=from_table(table), evaluate_every=6, monitor="score", n_epochs=10,
                        **kwargs)


def test_the_evaluation_that_stops_a_run_reaches_every_consumer(tmp_path) -> None:
    seen, log = [], io.StringIO()
    trainer = early_stopping_trainer(tmp_path, loggers=["jsonl"], run_dir=tmp_path / "run",
                                     callbacks=[RawTextProgress(print_every=1000, file=log)])
    trainer.add_callback_fn(Event.on_evaluate_end(), lambda t, results: seen.append(t.global_forward_batches))
    trainer.run(num_eval_sanity_batch=0)
    assert trainer.global_forward_batches == 18
    assert seen == [6, 12, 18]  # a user handler after the EarlyStopCallback saw the stopping evaluation
    assert [row["step"] for row in trainer.history["evaluate"]] == [6, 12, 18]
    with open(tmp_path / "run" / "metrics.jsonl") as f:
        rows = [json.loads(line) for line in f]
    assert [row["step"] for row in rows if "eval/score#score" in row] == [6, 12, 18]
    summary = read_json(tmp_path / "run" / "summary.json")
    assert summary["score#score"] == pytest.approx(0.7) and summary["status"] == "stopped"
    final = log.getvalue().splitlines()[-1]
    assert "best 0.9, last 0.7) at step 18; after " in final, final  # rounded, one separator
    assert "last evaluation score#score=0.7" in final, final
    # the summary line and summary.json name the same step and epoch (step 18 is in epoch 2 of 13 batches)
    assert f"at step {summary['step']} (epoch {summary['epoch']})" in final and summary["epoch"] == 2


def test_latest_over_an_early_stopped_run_trains_nothing_and_an_explicit_resume_trains_on(tmp_path, caplog) -> None:
    early_stopping_trainer(tmp_path).run(num_eval_sanity_batch=0)
    last = tmp_path / "ckpt" / "last"
    manifest = read_json(last / "manifest.json")
    assert manifest["trainer"]["ended"] == "early_stopped"
    before = {name: os.stat(tmp_path / "ckpt" / name).st_mtime_ns for name in listing(tmp_path / "ckpt")}

    again = early_stopping_trainer(tmp_path)
    begun = []
    again.add_callback_fn(Event.on_train_begin(), lambda t: begun.append(True))
    with caplog.at_level(logging.INFO, logger="drivetrain"):
        again.run(resume_from="latest", num_eval_sanity_batch=0)
    assert begun == [] and again.global_forward_batches == 18
    said = [r.getMessage() for r in caplog.records if "nothing to train" in r.getMessage()]
    assert len(said) == 1 and "stopped early" in said[0] and f"resume_from={str(last)!r}" in said[0], said
    assert {n: os.stat(tmp_path / "ckpt" / n).st_mtime_ns for n in listing(tmp_path / "ckpt")} == before

    caplog.clear()
    explicit = early_stopping_trainer(tmp_path, patience=50)
    with caplog.at_level(logging.INFO, logger="drivetrain"):
        explicit.run(resume_from=last, num_eval_sanity_batch=0)
    assert explicit.global_forward_batches > 18
    assert any("continuing a run that stopped early" in r.getMessage() for r in caplog.records)


def test_a_finished_run_started_again_trains_nothing_and_says_which_n_epochs_would(tmp_path, caplog) -> None:
    first = make_trainer([CheckpointCallback(tmp_path / "ckpt")], n_epochs=2, loggers=["csv"],
                         run_dir=tmp_path / "run")
    first.run(num_eval_sanity_batch=0)
    assert read_json(tmp_path / "ckpt" / "last" / "manifest.json")["trainer"]["ended"] == "finished"
    record = {name: os.stat(tmp_path / "run" / name).st_mtime_ns for name in os.listdir(tmp_path / "run")}
    last = os.stat(tmp_path / "ckpt" / "last" / "manifest.json").st_mtime_ns
    for n_epochs in (1, 2):
        again = make_trainer([CheckpointCallback(tmp_path / "ckpt")], n_epochs=n_epochs, loggers=["csv"],
                             run_dir=tmp_path / "run")
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="drivetrain"):
            again.run(resume_from="latest", num_eval_sanity_batch=0)
        messages = [r.getMessage() for r in caplog.records if "nothing to train" in r.getMessage()]
        assert len(messages) == 1, messages
        assert "holds the end of epoch 2 (step 26)" in messages[0] and "Pass n_epochs=3 or more" in messages[0]
        assert f"n_epochs={n_epochs} asks for no more" in messages[0]
        assert again.global_forward_batches == 26
    assert os.stat(tmp_path / "ckpt" / "last" / "manifest.json").st_mtime_ns == last
    assert {name: os.stat(tmp_path / "run" / name).st_mtime_ns for name in os.listdir(tmp_path / "run")} == record
    # the advice works: one more epoch trains 13 more steps from where the run ended
    more = make_trainer([CheckpointCallback(tmp_path / "ckpt")], n_epochs=3)
    with caplog.at_level(logging.INFO, logger="drivetrain"):
        more.run(resume_from="latest", num_eval_sanity_batch=0)
    assert more.global_forward_batches == 39
    assert any("continuing a run that finished at the end of epoch 2" in r.getMessage() for r in caplog.records)


SCRIPT = """
    import os, signal, sys
    sys.path.insert(0, {root!r})
    from drivetrain import CheckpointCallback, Event
    from tests._signals import wait_for_a_signal
    from tests.core._callback_helpers import make_trainer

    folder = sys.argv[1]
    trainer = make_trainer([CheckpointCallback(folder, every_n_batches=5, save_on_exception=True)], n_epochs=1000,
                           loggers=["jsonl"], run_dir=os.path.join(folder, "run"))

    def ready(t):
        if t.global_forward_batches == 7:
            print("waiting for the signal", flush=True)
            wait_for_a_signal(60)  # the signal arrives here, inside a step
    trainer.add_callback_fn(Event.on_train_batch_end(), ready)
    try:
        trainer.run(num_eval_sanity_batch=0)
    finally:
        print("run() left", flush=True)
    print("the script went on after run()", flush=True)
"""


@pytest.mark.parametrize("signum, status, status_word", [(signal.SIGINT, -signal.SIGINT, "stopped"),
                                                         (signal.SIGTERM, 143, "stopped")])
def test_ctrl_c_and_sigterm_save_the_exception_checkpoint_then_end_the_process_non_zero(
        tmp_path, signum, status, status_word) -> None:
    """The script does not go on after run(), a scheduler sees a failure (130 / SIGINT like any Python program,
    143 for SIGTERM), and save_on_exception wrote its checkpoint first."""
    proc = popen_interruptible([sys.executable, "-c", textwrap.dedent(SCRIPT.format(root=ROOT)), str(tmp_path)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONPATH": ROOT})
    try:
        read_until(proc, "waiting for the signal", "before the signal")
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == status, (proc.returncode, err[-2000:])
    assert "run() left" in out and "the script went on" not in out
    assert "exception-step_00000007" in listing(tmp_path), listing(tmp_path)
    manifest = read_json(tmp_path / "exception-step_00000007" / "manifest.json")
    expected = "KeyboardInterrupt" if signum == signal.SIGINT else "TrainingTerminated"
    assert manifest["trainer"]["after_exception"] == expected
    assert read_json(tmp_path / "run" / "summary.json")["status"] == status_word
    if signum == signal.SIGTERM:
        assert "SIGTERM received" in err


WORKER_THREAD_SCRIPT = """
    import os, signal, sys, threading
    sys.path.insert(0, {root!r})
    from drivetrain import CheckpointCallback, Event
    from tests._signals import wait_for_a_signal
    from tests.core._callback_helpers import make_trainer

    folder = sys.argv[1]
    trainer = make_trainer([CheckpointCallback(folder, every_n_batches=5, save_on_exception=True)], n_epochs=1000,
                           loggers=["jsonl"], run_dir=os.path.join(folder, "run"))
    idle = threading.Event()

    def to_a_worker_thread(t):
        if t.global_forward_batches == 7:  # as the kernel may do with a signal sent to the process
            worker = threading.Thread(target=idle.wait, daemon=True)
            worker.start()
            signal.pthread_kill(worker.ident, signal.SIGTERM)
            wait_for_a_signal(30)  # the rest of this step
    trainer.add_callback_fn(Event.on_train_batch_end(), to_a_worker_thread)
    trainer.run(num_eval_sanity_batch=0)
"""


def test_a_sigterm_the_kernel_gives_to_another_thread_still_ends_the_run_after_saving(tmp_path) -> None:
    """A signal sent to a process may reach any of its threads (a data loader's, a framework's); Python runs the
    handler in the main thread at its next bytecode, so the run stops at once, saved, as for the main thread."""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(WORKER_THREAD_SCRIPT.format(root=ROOT)),
                           str(tmp_path)], capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": ROOT})
    assert proc.returncode == 128 + signal.SIGTERM, (proc.returncode, proc.stderr[-2000:])
    assert "SIGTERM received" in proc.stderr
    manifest = read_json(tmp_path / "exception-step_00000007" / "manifest.json")
    assert manifest["trainer"]["after_exception"] == "TrainingTerminated"
    assert read_json(tmp_path / "run" / "summary.json")["status"] == "stopped"


def test_catch_keyboard_interrupt_true_still_returns_quietly(tmp_path) -> None:
    """fastNLP's habit, asked for by name: run() returns after Ctrl-C."""
    trainer = make_trainer(n_epochs=2)

    def interrupt(t):
        if t.global_forward_batches == 3:
            raise KeyboardInterrupt

    trainer.add_callback_fn(Event.on_train_batch_end(), interrupt)
    trainer.run(num_eval_sanity_batch=0, catch_KeyboardInterrupt=True)
    assert trainer.global_forward_batches == 3


def test_summary_json_counts_this_runs_seconds_and_the_whole_runs(tmp_path) -> None:
    first = make_trainer([CheckpointCallback(tmp_path / "ckpt", every_n_batches=13)], n_epochs=1, loggers=["jsonl"],
                         run_dir=tmp_path / "run")
    first.run(num_eval_sanity_batch=0)
    one = read_json(tmp_path / "run" / "summary.json")
    assert one["seconds_total"] == pytest.approx(one["seconds"], abs=0.01) and "resumed_at_step" not in one
    second = make_trainer([CheckpointCallback(tmp_path / "ckpt", every_n_batches=13)], n_epochs=2,
                          loggers=["jsonl"], run_dir=tmp_path / "run")
    second.run(resume_from="latest", num_eval_sanity_batch=0)
    two = read_json(tmp_path / "run" / "summary.json")
    assert two["resumed_at_step"] == 13 and two["step"] == 26 and two["epoch"] == 2
    # the first run's time up to its checkpoint at step 13 (what a resume can know) counts; its tail after the
    # save does not, and on a loaded machine that tail can be most of a run this short
    assert two["seconds"] + 0.001 < two["seconds_total"] <= two["seconds"] + one["seconds"] + 0.002
