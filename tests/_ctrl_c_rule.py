"""Ctrl-C on a multi-process run, for every backend and launcher: the phases the processes run and the checks.
Framework-free (drivetrain's core only); the backends' ``_resume_script.py`` give the run (``make_trainer``,
see ``_resume_rule.py``) and start these phases through ``_resume_rule.main``:

- ``ctrl-c``: ``resume_from="latest"`` with ``CheckpointCallback(OUT/ckpt, every_n_batches=CKPT_EVERY,
  save_on_exception=True)`` and a csv record in ``OUT/record``; every rank computes for minutes once batch
  ``READY_AT + 1`` begins, where rank 0 prints ``ready <its pid>``: the test sends its signal then;
- ``resume``: the same command line without the pause (it resumes from the newest periodic checkpoint);
- ``straight``: the same run uninterrupted, into ``OUT/straight``.

``resume`` and ``straight`` write ``OUT/<phase>-rank<r>.json`` (the final parameters). With
``DRIVETRAIN_TEST_NPROC=N`` in the environment the Trainer starts the processes itself (``nproc=N``).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from drivetrain import Callback, CheckpointCallback

from ._signals import wait_for_a_signal

CKPT_EVERY, READY_AT = 2, 4
BOUND = 15.0  # seconds from the signal to the end of every process
NPROC_ENV = "DRIVETRAIN_TEST_NPROC"


class _Pause(Callback):
    """Once batch ``READY_AT + 1`` begins, rank 0 says ``ready`` and every rank waits for the signal
    (:func:`~tests._signals.wait_for_a_signal`: returning to Python often, as a step does)."""

    def on_train_batch_begin(self, trainer: Any, batch: Any, indices: Any) -> None:
        if trainer.global_forward_batches == READY_AT:
            if trainer.driver.rank == 0:
                print(f"ready {os.getpid()}", flush=True)
            wait_for_a_signal(300)


def run_phase(phase: str, out: str, make_trainer: Any) -> None:
    """Run ``phase`` (see the module docstring) with the backend's ``make_trainer(n_epochs, callbacks, **options)``."""
    folder = os.path.join(out, "straight" if phase == "straight" else "")
    callbacks: list = [CheckpointCallback(os.path.join(folder, "ckpt"), every_n_batches=CKPT_EVERY, save_last=False,
                                          save_on_exception=True)]
    if phase == "ctrl-c":
        callbacks.append(_Pause())
    options: dict[str, Any] = {"loggers": ["csv"], "run_dir": os.path.join(folder, "record"), "log_every_n_steps": 1}
    if os.environ.get(NPROC_ENV):
        options["nproc"] = int(os.environ[NPROC_ENV])
    trainer = make_trainer(2, callbacks, **options)
    trainer.run(resume_from="latest", num_eval_sanity_batch=0)
    driver = trainer.driver
    params = {name: driver.tensor_to_numpy(value).ravel().tolist() for name, value in driver.model_state().items()}
    with open(os.path.join(out, f"{phase}-rank{driver.rank}.json"), "w") as f:
        json.dump(params, f)


# ------------------------------------------------------------------------------ checks (test side)
def cases(framework_launcher: str, alone: str = "rank0") -> list[tuple[str, str, bool]]:
    """(launcher, what gets the signal, resumed afterwards) for a backend's test: Ctrl-C to the process group and
    SIGINT to one process (``alone``: ``"rank0"``, or ``"launcher"`` where the Trainer's process only supervises),
    for ``nproc=2`` and for the framework's own launcher. One resume per backend, after the framework launcher's
    Ctrl-C: what a resume reads (the checkpoints, the record) does not depend on who started the processes, and
    :func:`check_stopped` checks what each launcher's stop left behind."""
    return [("nproc", "group", False), ("nproc", alone, False),
            (framework_launcher, "group", True), (framework_launcher, "launcher", False)]



def launches(out: Path, script: str, launcher: str, env: Callable[[], dict[str, str]],
             framework: Callable[[], list[str]]) -> Callable[[str], Any]:
    """``launch(phases)`` for :func:`interrupt_and_resume`: ``python SCRIPT OUT PHASES`` started interruptible in
    ``out`` with ``env()``, with ``nproc=2`` (``launcher="nproc"``) or under the framework's launcher (``framework()``:
    what comes between ``python`` and the script, e.g. ``["-m", "its.launch", "--nproc_per_node", "2"]``)."""
    from tests._dist_helpers import ProcessGroup

    numbers = iter(range(2))

    def launch(phases: str) -> ProcessGroup:
        child, command = env(), [sys.executable, script, str(out), phases]
        if launcher == "nproc":
            child[NPROC_ENV] = "2"
        else:
            command[1:1] = framework()
        return ProcessGroup(command, out, child, f"launch-{next(numbers)}", cwd=out, interruptible=True)

    return launch


# (plain asserts with messages: pytest rewrites only the test modules' own asserts)
def check_stopped(out: Path, output: str, seconds: float, returncode: int, signum: int,
                  launcher_code: int | None = None, launcher_traceback: str | None = None,
                  bound: float = BOUND) -> None:
    """Every process ended within ``bound`` seconds of ``signum``, by it (``launcher_code``: what a
    framework's launcher exits with instead), with one line and no traceback (``launcher_traceback``: the
    exception a framework's launcher prints its own for); the exception checkpoint is written and the record
    says ``stopped``. The line is rank 0's, about the signal that reached it first (a framework's launcher
    may pass Ctrl-C on as SIGTERM: paddle's, oneflow's)."""
    assert seconds < bound, f"{seconds:.1f} s after the signal:\n{output}"
    expected = launcher_code if launcher_code is not None else -signum if signum == signal.SIGINT else 128 + signum
    assert returncode == expected, f"exit {returncode}, expected {expected}:\n{output}"
    assert output.count("Traceback") == (launcher_traceback is not None), output
    assert launcher_traceback is None or launcher_traceback in output, output
    said = ("training stopped at step", "SIGTERM received: ending the run")
    assert sum(output.count(line) for line in said) == 1, f"not one line saying how the run stopped:\n{output}"
    assert "DistributedError" not in output and "CallbackError" not in output, output
    summary = json.loads((out / "record" / "summary.json").read_text())
    assert summary["status"] == "stopped", summary
    checkpoints = sorted(p.name for p in (out / "ckpt").iterdir())
    assert f"exception-step_{READY_AT:08d}" in checkpoints, checkpoints


def check_resumed(out: Path, world: int) -> None:
    """``resume`` ended with the parameters of ``straight``, on every rank."""
    for rank in range(world):
        resumed = json.loads((out / f"resume-rank{rank}.json").read_text())
        straight = json.loads((out / f"straight-rank{rank}.json").read_text())
        assert sorted(resumed) == sorted(straight)
        worst = max(abs(a - b) for name in resumed for a, b in zip(resumed[name], straight[name], strict=True))
        assert worst < 1e-6, f"rank {rank}: the resumed run differs from the uninterrupted one by {worst}"


def interrupt_and_resume(launch: Any, out: Path, signum: int, target: str, *, resume: bool,
                         launcher_code: int | None = None, launcher_traceback: str | None = None, logs: Any = None,
                         timeout: float = 150, bound: float = BOUND) -> None:
    """Start ``launch("ctrl-c")`` (a :class:`~tests._dist_helpers.ProcessGroup`, started interruptible), send
    ``signum`` to ``target`` once it is ready (see :func:`~tests._dist_helpers.stop_when_ready`), check how it
    ended (:func:`check_stopped`, with ``launcher_code``, ``launcher_traceback`` and ``bound``; ``logs()``: the workers' output where the launcher keeps it apart); with
    ``resume``, then run ``launch("resume,straight")`` to its end and check that the resume was exact."""
    from tests._dist_helpers import stop_when_ready

    group = launch("ctrl-c")
    try:
        done = stop_when_ready(group, signum, target, timeout, logs)
    finally:
        group.close()
    output = done.output + (logs() if logs is not None else "")
    print(f"\n{signal.Signals(signum).name} to {target}: exit {done.returncode}, {done.seconds:.1f} s after the signal")
    check_stopped(out, output, done.seconds, done.returncode, signum, launcher_code, launcher_traceback, bound)
    if not resume:
        return
    again = launch("resume,straight")
    try:
        finished = again.wait(timeout)
    finally:
        again.close()
    assert finished.returncode == 0, finished.output + (logs() if logs is not None else "")
    check_resumed(out, world=2)
