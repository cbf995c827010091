"""The parent side of the kill -9 tests: start ``_kill9_train.py``, SIGKILL it at random moments, resume.

Shared by the ``test_*kill9*`` tests of every engine and ``bench/kill9_stress.py``. One *round* trains
from scratch in a fresh folder: the first start and zero or more of the resumed ones are killed with
SIGKILL after a random delay, then a resume runs to the end; the newest checkpoint it leaves must be
bit-identical to the uninterrupted run's (every tensor of every file: model, optimizer, random generators,
each rank's shard). After every kill each checkpoint under its real name must verify
(:func:`drivetrain._format.folder.read_checkpoint`); ``.tmp-`` folders may be left behind.

With several processes (``nproc=2``: the Trainer starts the other rank; jittor: ``mpirun -np 2``) a kill
hits one random rank or the whole job (every process of its session at once). After a rank is killed
the others must end by themselves within ``watchdog_bound`` seconds (the distributed watchdog, or
``mpirun``); only then is the folder checked and the job resumed.

When: most kills come a random time (up to the training left) after rank 0 printed ``begin``, so that
start-up times, which vary far more than training on a loaded machine, do not push kills out of training;
30% of the resumed starts are killed a random time after they were started instead, aimed at start-up and
loading. Where a kill landed is told from what it left (listed the moment the signal went out):

- ``save``: a new ``.tmp-step-...`` folder (killed while a checkpoint was written);
- ``rotation``: a new ``.tmp-del-...`` / ``.tmp-old-...`` folder (killed while an old checkpoint was deleted);
- ``resume``: a ``--resume`` start killed before training began (while starting up and loading);
- ``startup``: a fresh start killed before training began;
- ``training``: anything else (between two saves).
"""

from __future__ import annotations

import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from drivetrain._format import list_checkpoints
from drivetrain._format.folder import TEMP_PREFIX, read_checkpoint
from drivetrain._format.lock import LOCK_NAME

from ._kill9_procs import Job, Kill9Failure

__all__ = ["Delays", "Engine", "Kill9Failure", "Tally", "kill_rounds", "short_kill_test"]

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_kill9_train.py")
DELAY_ENV = "DRIVETRAIN_KILL9_SAVE_DELAY"
STEP_DELAY_ENV = "DRIVETRAIN_KILL9_STEP_DELAY"
CHECKPOINT_KWARGS_ENV = "DRIVETRAIN_KILL9_CHECKPOINT_KWARGS"
DIST_TIMEOUT_ENV = "DRIVETRAIN_KILL9_DIST_TIMEOUT"


@dataclass(frozen=True)
class Engine:
    """What the child runs: ``driver`` on ``nproc`` processes (jittor's several start under ``mpirun``)."""

    driver: str = "numpy"
    nproc: int = 1

    @property
    def name(self) -> str:
        return self.driver if self.nproc == 1 else f"{self.driver} x{self.nproc}"

    def command(self, ckpt_dir: str, out_file: str, resume: bool, pid_dir: str | None) -> list[str]:
        cmd = [sys.executable, SCRIPT, ckpt_dir, out_file, "--driver", self.driver]
        if self.nproc > 1:
            if self.driver == "jittor":
                mpirun = shutil.which("mpirun") or "mpirun"
                cmd = [mpirun, "-np", str(self.nproc), "--oversubscribe", *cmd]
            else:
                cmd += ["--nproc", str(self.nproc)]
        if pid_dir is not None:
            cmd += ["--pid-dir", pid_dir]
        return cmd + ["--resume"] if resume else cmd


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
    targets: Counter = field(default_factory=Counter)  # what each kill hit: "job" or "rank<r>"
    survivors_ended: list[float] = field(default_factory=list)  # seconds for the other ranks to end, per rank kill
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
        text = (f"{self.total_kills} kills in {self.rounds} rounds ({self.processes} processes): "
                f"{self.landed('save')} during a save, {self.landed('rotation')} during a checkpoint deletion, "
                f"{self.landed('training')} during training between saves, {self.kills['resume']} during a "
                f"resume (before the resumed run's first batch), {self.kills['startup']} during start-up; "
                f"{self.resume_kills} of the kills hit a resumed process; {self.missed} kill(s) came after the "
                f"process had finished; bit-exact rounds: {self.bit_exact_rounds}/{self.rounds}; "
                f"checkpoint folders verified: {self.checkpoints_verified}")
        if self.survivors_ended:
            text += (f"; targets {dict(sorted(self.targets.items()))}, the other ranks ended within "
                     f"{max(self.survivors_ended):.1f} s of a rank's kill (median "
                     f"{statistics.median(self.survivors_ended):.1f} s)")
        return text


@dataclass(frozen=True)
class Delays:
    """Sleeps injected into the child: before each file a save writes, and at the start of each batch."""

    save: float = 0.0
    step: float = 0.0


def _env(delays: Delays, dist_timeout: float) -> dict[str, str]:
    # a launcher's variables of this process are not the child's; nor is JAX's compilation cache (tox.ini's jax
    # env), which writes its entries in place: a kill during that write would leave a broken entry for later runs
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                        "JAX_COMPILATION_CACHE_DIR")}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONHASHSEED="0", PYTHONUNBUFFERED="1",
               GLOG_minloglevel="2", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    env[DELAY_ENV] = str(delays.save)
    env[STEP_DELAY_ENV] = str(delays.step)
    env[DIST_TIMEOUT_ENV] = str(dist_timeout)
    return env


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
            if len(words) == 3 and words[0] in ("begin", "done") and words[1].isdigit():
                setattr(report, words[0], (int(words[1]), float(words[2])))
        return report


def _temp_entries(ckpt_dir: str) -> set[str]:
    if not os.path.isdir(ckpt_dir):
        return set()
    return {e for e in os.listdir(ckpt_dir) if e.startswith(TEMP_PREFIX)}


def _newest_step(ckpt_dir: str) -> int:
    """The batches trained in the newest complete checkpoint (0: none), as the resume will choose it."""
    found = list_checkpoints(ckpt_dir)
    return int(found[-1][1]["trainer"]["global_forward_batches"]) if found else 0


def verify_checkpoints(ckpt_dir: str) -> int:
    """Every entry under a real (non-temp) name must be a checkpoint that verifies; return how many.

    The run's lock file (``.drivetrain-run.lock``, left by a killed run) is no checkpoint and is skipped.
    """
    if not os.path.isdir(ckpt_dir):
        return 0
    count = 0
    for entry in sorted(os.listdir(ckpt_dir)):
        if entry.startswith(TEMP_PREFIX) or entry == LOCK_NAME:
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
    differ = [key for key, ref in reference.items()
              if result[key].dtype != ref.dtype or result[key].shape != ref.shape
              or result[key].tobytes() != ref.tobytes()]
    if differ:
        raise Kill9Failure(f"{where}: {differ} are not bit-identical to the uninterrupted run's")


@dataclass
class Runner:
    """Starts the child of ``engine`` with fixed delays and bounds; every start gets its own log."""

    engine: Engine
    delays: Delays
    timeout: float  # for a whole start to end
    watchdog_bound: float  # for the other ranks to end after a rank's kill
    dist_timeout: float  # the driver's timeout for waiting on another rank
    workdir: str
    starts: int = 0
    last_end: float = 0.0  # seconds from the last kill until every process of its job had ended

    def start(self, ckpt_dir: str, out_file: str, resume: bool) -> Job:
        self.starts += 1
        tag = os.path.join(self.workdir, "logs", f"{os.path.basename(ckpt_dir)}-{self.starts:05d}")
        os.makedirs(os.path.dirname(tag), exist_ok=True)
        pid_dir = f"{tag}.pids" if self.engine.nproc > 1 else None
        return Job.start(self.engine.command(ckpt_dir, out_file, resume, pid_dir),
                         _env(self.delays, self.dist_timeout), f"{tag}.log", pid_dir)

    def run_to_end(self, ckpt_dir: str, out_file: str, *, resume: bool) -> tuple[Report, float]:
        """Run the child to completion; return (its report, the unix time it was started)."""
        what = "resume" if resume else "run"
        job = self.start(ckpt_dir, out_file, resume)
        try:
            job.proc.wait(timeout=self.timeout)
        except subprocess.TimeoutExpired as exc:
            job.kill_job()
            job.proc.wait()
            raise Kill9Failure(f"{what} in {ckpt_dir} did not finish in {self.timeout} s:\n"
                               f"{job.output()[-3000:]}") from exc
        job.wait_all_gone(self.watchdog_bound)
        if job.proc.returncode != 0:
            raise Kill9Failure(f"{what} in {ckpt_dir} failed (exit {job.proc.returncode}):\n{job.output()[-3000:]}")
        report = Report.parse(job.output())
        if report.begin is None or report.done is None:
            raise Kill9Failure(f"{ckpt_dir}: the child printed no 'begin'/'done' lines:\n{job.output()[-3000:]}")
        return report, job.started

    def kill_after(self, job: Job, delay: float, rng: random.Random, ckpt_dir: str,
                   from_begin: bool) -> tuple[str | None, set[str]]:
        """SIGKILL the job (or one of its ranks) ``delay`` s after its start (``from_begin``: after rank 0 said
        ``begin``, so that start-up times, which vary much more than training on a loaded machine, do not move
        the kill out of training) unless it ended first; wait until all of it ended. Return (what was killed,
        or None; the temp entries of ``ckpt_dir`` the moment it was killed)."""
        try:
            if from_begin:
                self._wait_for_begin(job)
            job.proc.wait(timeout=delay)
        except subprocess.TimeoutExpired:
            target = job.kill(rng, rank_share=0.5 if self.engine.nproc > 1 else 0.0)
            temps = _temp_entries(ckpt_dir)
            bound = self.watchdog_bound if target != "job" else 10.0
            self.last_end = job.wait_all_gone(bound)
            return target, temps
        job.wait_all_gone(self.watchdog_bound)
        return None, set()

    def _wait_for_begin(self, job: Job) -> None:
        """Until the job's log has a ``begin`` line or the job ended; at most ``timeout`` seconds."""
        give_up = time.monotonic() + self.timeout
        while Report.parse(job.output()).begin is None and time.monotonic() < give_up:
            try:
                job.proc.wait(timeout=0.02)
                return  # it ended
            except subprocess.TimeoutExpired:
                pass


def reference_run(runner: Runner) -> tuple[dict[str, np.ndarray], Timing]:
    """The uninterrupted run's final checkpoint and its timing (with the same delays)."""
    ckpt_dir, out_file = os.path.join(runner.workdir, "reference"), os.path.join(runner.workdir, "reference.npz")
    report, start = runner.run_to_end(ckpt_dir, out_file, resume=False)
    result = load_result(out_file)
    timing = Timing(steps=int(result["__global_forward_batches__"]))
    timing.observe(start, report)
    return result, timing


def kill_rounds(workdir: str, n_kills: int, *, seed: int, driver: str = "numpy", nproc: int = 1,
                delays: Delays | None = None, max_kills_per_round: int = 3, timeout: float = 60.0,
                deadline: float | None = None, watchdog_bound: float = 40.0, dist_timeout: float = 10.0,
                tally: Tally | None = None, log: Callable[[str], object] | None = None) -> Tally:
    """Kill ``n_kills`` processes (or jobs) at random moments (``random.Random(seed)``), resuming after each.

    Stops early (with fewer kills) at ``deadline`` (a ``time.monotonic()`` value).
    Raises :class:`Kill9Failure` on a checkpoint that does not verify, a resume that
    failed or did not take the newest checkpoint, ranks that outlived ``watchdog_bound``
    after another rank's kill, or a final checkpoint that differs from the uninterrupted run's.
    ``tally``: counted into as the rounds go (what was reached before a failure stays there).
    """
    rng = random.Random(seed)
    runner = Runner(Engine(driver, nproc), delays or Delays(), timeout, watchdog_bound, dist_timeout, workdir)
    reference, timing = reference_run(runner)
    tally = Tally() if tally is None else tally
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
            if newest_before >= timing.steps:  # the last checkpoint is written: a resume would only load it
                break
            begin, end = timing.window(newest_before)
            aim_at_resume = resume and rng.random() < 0.3  # the resume itself: start-up and loading
            after = rng.uniform(0.3 * begin, 1.2 * begin) if aim_at_resume else rng.uniform(0, end - begin)
            job = runner.start(ckpt_dir, out_file, resume)
            tally.processes += 1
            target, temps_at_kill = runner.kill_after(job, after, rng, ckpt_dir, from_begin=not aim_at_resume)
            report = Report.parse(job.output())
            timing.observe(job.started, report)
            begun = report.begin
            if resume and begun is not None and begun[0] != newest_before:
                raise Kill9Failure(f"{ckpt_dir}: a resume started at step {begun[0]}, but the newest complete "
                                   f"checkpoint was step {newest_before}")
            if begun is not None and resume:
                tally.resumed_from.append(begun[0])
            if target is None:
                if job.proc.returncode != 0:
                    raise Kill9Failure(f"{ckpt_dir}: a {'resumed ' if resume else ''}process exited with "
                                       f"{job.proc.returncode} before its kill:\n{job.output()[-3000:]}")
                tally.missed += 1
                if log is not None:
                    log(f"round {round_no}: the process resumed at {newest_before} finished before its kill "
                        f"after {after:.3f} s")
                finished = True
                break
            new_temps = temps_at_kill - temps_before
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
            tally.targets[target] += 1
            if target != "job":
                tally.survivors_ended.append(runner.last_end)
            tally.checkpoints_verified += verify_checkpoints(ckpt_dir)
            if log is not None:
                log(f"round {round_no}: kill ({target}) after {after:.3f} s landed in {where}"
                    + (f"; the other ranks ended {runner.last_end:.1f} s later" if target != "job" else ""))
            resume = True
        if not finished:
            newest_before = _newest_step(ckpt_dir)
            report, started = runner.run_to_end(ckpt_dir, out_file, resume=True)
            tally.processes += 1
            timing.observe(started, report)
            begun = report.begin
            if begun is None or begun[0] != newest_before:
                raise Kill9Failure(f"{ckpt_dir}: the final resume started at {begun}, not at step {newest_before}")
            tally.resumed_from.append(begun[0])
        tally.checkpoints_verified += verify_checkpoints(ckpt_dir)
        assert_bit_identical(load_result(out_file), reference, f"round {round_no} ({ckpt_dir})")
        tally.rounds += 1
        tally.bit_exact_rounds += 1
    return tally


def short_kill_test(workdir: str, n_kills: int, *, seed: int, driver: str, nproc: int = 1,
                    delays: Delays = Delays(save=0.01, step=0.02), max_kills_per_round: int = 3,
                    timeout: float = 120.0) -> Tally:
    """The short version each engine's tests run: ``n_kills`` kills, every round bit-exact, some process resumed
    from a checkpoint (else the test proved nothing); prints the tally and the time (``pytest -s``)."""
    start = time.monotonic()
    tally = kill_rounds(workdir, n_kills, seed=seed, driver=driver, nproc=nproc, delays=delays,
                        max_kills_per_round=max_kills_per_round, timeout=timeout)
    print(f"\nkill -9 ({Engine(driver, nproc).name}): {tally.summary()}; {time.monotonic() - start:.1f} s")
    assert tally.total_kills == n_kills
    assert tally.bit_exact_rounds == tally.rounds > 0
    assert any(step > 0 for step in tally.resumed_from), "no process resumed from a checkpoint; nothing was proved"
    return tally
