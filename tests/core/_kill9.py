"""The parent side of the kill -9 tests: start ``_kill9_train.py``, SIGKILL it at random moments, resume.

Shared by ``tests/core/test_kill9.py``, ``tests/torch/test_torch_kill9.py`` and
``bench/kill9_stress.py``. One *round* trains from scratch in a fresh folder: the
first process and zero or more of the resumed ones are killed with SIGKILL after a
random delay, then a resume runs to the end; its final parameters must be
bit-identical to those of an uninterrupted run. After every kill each checkpoint
under its real name must verify (:func:`drivetrain._format.folder.read_checkpoint`);
``.tmp-`` folders may be left behind.

Where a kill landed is told from what it left:

- ``save``: a new ``.tmp-step-...`` folder (killed while a checkpoint was written);
- ``rotation``: a new ``.tmp-del-...`` / ``.tmp-old-...`` folder (killed while an old checkpoint was deleted);
- ``resume``: a ``--resume`` process killed before training began (while starting up and loading);
- ``startup``: a fresh process killed before training began;
- ``training``: anything else (between two saves).
"""

from __future__ import annotations

import os
import random
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from drivetrain._format.folder import TEMP_PREFIX, read_checkpoint

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_kill9_train.py")
DELAY_ENV = "DRIVETRAIN_KILL9_SAVE_DELAY"
STEP_DELAY_ENV = "DRIVETRAIN_KILL9_STEP_DELAY"


class Kill9Failure(AssertionError):
    pass


@dataclass
class Timing:
    """How long the child takes, learnt from every process that got far enough to tell.

    ``begins``: seconds from starting a process to its first batch (start-up and any
    resume); ``per_step``: seconds per batch while training (saves included).
    """

    steps: int
    begins: list[float] = field(default_factory=list)
    per_step: list[float] = field(default_factory=list)

    def observe(self, started: float, report: Report) -> None:
        if report.begin is not None:
            self.begins.append(report.begin[1] - started)
            if report.done is not None and report.done[0] > report.begin[0]:
                self.per_step.append((report.done[1] - report.begin[1]) / (report.done[0] - report.begin[0]))

    def window(self, from_step: int) -> tuple[float, float]:
        """When a run resumed at ``from_step`` trains: (seconds after its start to its first batch, to its end)."""
        begin = statistics.median(self.begins)
        return begin, begin + statistics.median(self.per_step) * max(0, self.steps - from_step)


@dataclass
class Tally:
    kills: Counter = field(default_factory=Counter)  # where each kill landed (see the module docstring)
    missed: int = 0  # the process finished before its kill was due
    rounds: int = 0
    bit_exact_rounds: int = 0
    processes: int = 0
    checkpoints_verified: int = 0
    resumed_from: list[int] = field(default_factory=list)  # step each resumed process started at

    @property
    def total_kills(self) -> int:
        return sum(self.kills.values())

    @property
    def resume_kills(self) -> int:
        """Kills of ``--resume`` processes, wherever they landed."""
        return self.kills["resume"] + self.kills["resume+save"] + self.kills["resume+training"] + \
            self.kills["resume+rotation"]

    def landed(self, where: str) -> int:
        """Kills that landed in ``where`` ('save', 'training', 'rotation'), in a fresh or a resumed process."""
        return self.kills[where] + self.kills[f"resume+{where}"]

    def summary(self) -> str:
        return (f"{self.total_kills} kills in {self.rounds} rounds ({self.processes} processes): "
                f"{self.landed('save')} during a save, {self.landed('rotation')} during a checkpoint deletion, "
                f"{self.landed('training')} during training between saves, {self.kills['resume']} during a "
                f"resume (before the resumed run's first batch), {self.kills['startup']} during start-up; "
                f"{self.resume_kills} of the kills hit a resumed process; {self.missed} kill(s) came after the "
                f"process had finished; bit-exact rounds: {self.bit_exact_rounds}/{self.rounds}; "
                f"checkpoint folders verified: {self.checkpoints_verified}")


@dataclass(frozen=True)
class Delays:
    """Sleeps injected into the child: before each file a save writes, and at the start of each batch."""

    save: float = 0.0
    step: float = 0.0


def _env(delays: Delays) -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONHASHSEED="0")
    env[DELAY_ENV] = str(delays.save)
    env[STEP_DELAY_ENV] = str(delays.step)
    return env


def _command(ckpt_dir: str, out_file: str, resume: bool, driver: str) -> list[str]:
    cmd = [sys.executable, SCRIPT, ckpt_dir, out_file, "--driver", driver]
    return cmd + ["--resume"] if resume else cmd


@dataclass
class Report:
    """What the child printed: (global_forward_batches, unix time) when training began and when it was done."""

    begin: tuple[int, float] | None = None
    done: tuple[int, float] | None = None

    @classmethod
    def parse(cls, stdout: str) -> Report:
        report = cls()
        for line in stdout.splitlines():
            words = line.split()
            if len(words) == 3 and words[0] in ("begin", "done"):
                setattr(report, words[0], (int(words[1]), float(words[2])))
        return report


def _temp_entries(ckpt_dir: str) -> set[str]:
    if not os.path.isdir(ckpt_dir):
        return set()
    return {e for e in os.listdir(ckpt_dir) if e.startswith(TEMP_PREFIX)}


def _newest_step(ckpt_dir: str) -> int:
    if not os.path.isdir(ckpt_dir):
        return 0
    steps = [int(e.split("-")[1]) for e in os.listdir(ckpt_dir) if e.startswith("step-")]
    return max(steps, default=0)


def verify_checkpoints(ckpt_dir: str) -> int:
    """Every entry under a real (non-temp) name must be a checkpoint that verifies; return how many."""
    if not os.path.isdir(ckpt_dir):
        return 0
    count = 0
    for entry in sorted(os.listdir(ckpt_dir)):
        if entry.startswith(TEMP_PREFIX):
            continue
        path = os.path.join(ckpt_dir, entry)
        try:
            read_checkpoint(path)
        except Exception as exc:
            raise Kill9Failure(f"after a kill, {path} exists under its real name but does not verify: {exc}") from exc
        count += 1
    return count


def load_result(out_file: str) -> dict[str, np.ndarray]:
    with np.load(out_file) as data:
        return {k: data[k].copy() for k in data.files}


def assert_bit_identical(result: dict[str, np.ndarray], reference: dict[str, np.ndarray], where: str) -> None:
    if set(result) != set(reference):
        raise Kill9Failure(f"{where}: saved entries {sorted(result)} differ from the reference's {sorted(reference)}")
    for key, ref in reference.items():
        got = result[key]
        if got.dtype != ref.dtype or got.shape != ref.shape or got.tobytes() != ref.tobytes():
            diff = np.max(np.abs(got.astype(np.float64) - ref.astype(np.float64))) if got.shape == ref.shape else "?"
            raise Kill9Failure(f"{where}: {key!r} is not bit-identical to the uninterrupted run (max |diff| {diff})")


def run_to_end(ckpt_dir: str, out_file: str, *, resume: bool, driver: str, delays: Delays,
               timeout: float) -> tuple[Report, float]:
    """Run the script to completion; return (its report, the unix time it was started)."""
    start = time.time()
    try:
        proc = subprocess.run(_command(ckpt_dir, out_file, resume, driver), env=_env(delays), capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise Kill9Failure(f"{'resume' if resume else 'run'} in {ckpt_dir} did not finish in {timeout} s") from exc
    if proc.returncode != 0:
        raise Kill9Failure(f"{'resume' if resume else 'run'} in {ckpt_dir} failed (exit {proc.returncode}):\n"
                           f"{proc.stderr[-3000:]}")
    report = Report.parse(proc.stdout)
    if report.begin is None or report.done is None:
        raise Kill9Failure(f"{ckpt_dir}: the child printed no 'begin'/'done' lines: {proc.stdout!r}")
    return report, start


def reference_run(workdir: str, *, driver: str, delays: Delays, timeout: float) -> tuple[dict[str, np.ndarray], Timing]:
    """The uninterrupted run's final parameters and its timing (with the same delays)."""
    ckpt_dir, out_file = os.path.join(workdir, "reference"), os.path.join(workdir, "reference.npz")
    report, start = run_to_end(ckpt_dir, out_file, resume=False, driver=driver, delays=delays, timeout=timeout)
    result = load_result(out_file)
    timing = Timing(steps=int(result["__global_forward_batches__"]))
    timing.observe(start, report)
    return result, timing


def _kill_after(proc: subprocess.Popen, delay: float, timeout: float) -> tuple[bool, str, str]:
    """SIGKILL ``proc`` after ``delay`` s unless it ended first; return (killed, stdout, stderr)."""
    try:
        proc.wait(timeout=delay)
        killed = False
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
        killed = True
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        proc.kill()
        proc.communicate()
        raise Kill9Failure(f"a process did not end within {timeout} s of its kill time") from exc
    return killed, stdout, stderr


def kill_rounds(workdir: str, n_kills: int, *, seed: int, driver: str = "numpy", delays: Delays | None = None,
                max_kills_per_round: int = 3, timeout: float = 60.0, deadline: float | None = None,
                reference: dict[str, np.ndarray] | None = None, timing: Timing | None = None,
                log=None) -> Tally:
    """Kill ``n_kills`` processes at random moments (``random.Random(seed)``), resuming after each.

    Stops early (with fewer kills) at ``deadline`` (a ``time.monotonic()`` value).
    Raises :class:`Kill9Failure` on a checkpoint that does not verify, a resume that
    failed or did not take the newest checkpoint, or final parameters that differ.
    """
    rng = random.Random(seed)
    delays = delays or Delays()
    if reference is None or timing is None:
        reference, timing = reference_run(workdir, driver=driver, delays=delays, timeout=timeout)
    tally = Tally()
    round_no = 0
    while tally.total_kills < n_kills and (deadline is None or time.monotonic() < deadline):
        round_no += 1
        ckpt_dir = os.path.join(workdir, f"round-{round_no:04d}")
        out_file = os.path.join(workdir, f"round-{round_no:04d}.npz")
        kills_this_round = min(rng.randint(1, max_kills_per_round), n_kills - tally.total_kills)
        resume = False
        finished = False
        for _ in range(kills_this_round):
            temps_before = _temp_entries(ckpt_dir)
            newest_before = _newest_step(ckpt_dir)
            begin, end = timing.window(newest_before)
            if resume and rng.random() < 0.3:  # aim at the resume itself: start-up and loading
                after = rng.uniform(0.3 * begin, 1.2 * begin)
            else:
                after = rng.uniform(begin, end)
            started = time.time()
            proc = subprocess.Popen(_command(ckpt_dir, out_file, resume, driver), env=_env(delays),
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            tally.processes += 1
            killed, stdout, stderr = _kill_after(proc, after, timeout)
            report = Report.parse(stdout)
            timing.observe(started, report)
            begun = report.begin
            if resume and begun is not None and begun[0] != newest_before:
                raise Kill9Failure(f"{ckpt_dir}: a resume started at step {begun[0]}, but the newest complete "
                                   f"checkpoint was step {newest_before}")
            if begun is not None and resume:
                tally.resumed_from.append(begun[0])
            if not killed:
                if proc.returncode != 0:
                    raise Kill9Failure(f"{ckpt_dir}: a {'resumed ' if resume else ''}process exited with "
                                       f"{proc.returncode} before its kill:\n{stderr[-3000:]}")
                tally.missed += 1
                if log is not None:
                    log(f"round {round_no}: the process resumed at {newest_before} finished before its kill "
                        f"after {after:.3f} s")
                finished = True
                break
            new_temps = _temp_entries(ckpt_dir) - temps_before
            if begun is None:
                where = "resume" if resume else "startup"
            elif any(not t.startswith((f"{TEMP_PREFIX}del-", f"{TEMP_PREFIX}old-")) for t in new_temps):
                where = "save"
            elif new_temps:
                where = "rotation"
            else:
                where = "training"
            if resume and where != "resume":
                where = f"resume+{where}"
            tally.kills[where] += 1
            tally.checkpoints_verified += verify_checkpoints(ckpt_dir)
            if log is not None:
                log(f"round {round_no}: kill after {after:.3f} s landed in {where}")
            resume = True
        if not finished:
            newest_before = _newest_step(ckpt_dir)
            report, started = run_to_end(ckpt_dir, out_file, resume=True, driver=driver, delays=delays,
                                         timeout=timeout)
            tally.processes += 1
            timing.observe(started, report)
            begun = report.begin
            if begun[0] != newest_before:
                raise Kill9Failure(f"{ckpt_dir}: the final resume started at {begun}, not at step {newest_before}")
            tally.resumed_from.append(begun[0])
        tally.checkpoints_verified += verify_checkpoints(ckpt_dir)
        assert_bit_identical(load_result(out_file), reference, f"round {round_no} ({ckpt_dir})")
        tally.rounds += 1
        tally.bit_exact_rounds += 1
    return tally
