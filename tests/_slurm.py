"""A one-host Slurm cluster for the tests of every backend (issue 40): ``munged``, ``slurmctld`` and ``slurmd``
run as child processes of the test session, in a private temporary folder, on ports of their own, so that
they collide neither with a Slurm nor with a munge the machine runs already.

Use in a test module::

    from tests import _slurm

    slurm_cluster = _slurm.slurm_cluster  # the session fixture, re-exported

    @pytest.mark.distributed
    def test_something(slurm_cluster, tmp_path):
        out = slurm_cluster.run(["srun", "-n", "2", sys.executable, "-c", "..."], timeout=60).stdout
        job = slurm_cluster.sbatch("srun python train.py", "-n", "2", "--requeue", cwd=tmp_path)
        slurm_cluster.wait_job(job, "RUNNING", timeout=30)
        slurm_cluster.output(job).read_text()

The fixture skips (with the reason) where Slurm is missing and cannot be installed (not root, no
``apt-get``, no way to the Debian mirror); ``ensure_slurm()`` installs ``slurm-wlm``, ``munge`` and
``libpmix-dev`` with ``apt-get`` as root. Only the standard library and pytest.

What a test must know (Debian 12's slurm-wlm 22.05.8; the first two as issue 40 measured them):

- Every path in ``slurm.conf`` is absolute: a relative one makes ``slurmstepd`` loop and the job hang in
  COMPLETING.
- ``libpmix-dev`` installed while ``slurmd`` runs makes the next ``--mpi=pmix`` step hang: install it
  before the cluster starts (``ensure_slurm`` does), or ``restart_slurmd()``.
- A requeued job (``scontrol requeue``, or a preempted ``--requeue`` job) waits ~2 min for its
  ``BeginTime`` (the credential lifetime, ``AuthInfo=cred_expire``), and then for the next periodic
  scheduler pass (``sched_interval``, 60 s): ``nudge(job)`` starts it now. Not in the same wall-clock
  second its last run was killed in, though: slurmd refuses a credential made in the second it revoked the
  last one ("Job credential revoked") and the job FAILs; ``nudge`` waits for the next second.
- ``SLURM_RESTART_COUNT`` is unset in a job's first run, ``1`` after one requeue.
- Signals: ``scancel --signal=USR1 JOB`` and ``sbatch --signal=USR1@T`` reach the steps' tasks (what
  ``srun`` started), not the batch shell; ``scancel --signal=USR1 --batch JOB`` and
  ``sbatch --signal=B:USR1@T`` reach only the batch shell, not the steps; ``scancel --signal=USR1 --full
  JOB`` reaches both, each task once. A shell runs a trap only between commands: the script waits with
  ``wait`` in a loop (``wait`` returns early when a trapped signal arrives).
- A timed signal (``--signal=...@T``) comes at slurmctld's 30-second time-limit check, the first one after
  ``end - T - 30``: with ``--time=1`` and ``T >= 30``, 0 to 30 s after the start.
- ``slurmstepd`` (and so every task of a job) leaves the process tree of ``slurmd`` (its parent becomes
  init, in a session of its own): the cluster finds them by a marker variable in their environment and
  kills them when it stops, and a watchdog process does the same when the test session dies without
  stopping it (SIGKILL, a timeout's SIGTERM).
- munged wants its socket's folder searchable by everyone (``tempfile.mkdtemp`` makes 0700): the cluster's
  folder is made 0755, its key folder stays 0700. A unix socket path has at most 107 bytes.
- ``munged``, ``slurmctld`` and ``slurmd`` live in ``/usr/sbin``, often not on a test runner's PATH.
- ``batch_sched_delay=0``: a submitted batch job starts in ~1 s, not ~3 s.
"""

from __future__ import annotations

import functools
import glob
import os
import random
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path

import pytest

from tests._dist_helpers import free_ports

PACKAGES = ("slurm-wlm", "munge")
PMIX_PACKAGE = "libpmix-dev"
DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("srun", "sbatch", "scontrol", "squeue", "sinfo", "scancel")
_SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/local/sbin", "/usr/local/bin", "/usr/sbin",
                                "/usr/bin", "/sbin", "/bin"])
MARKER = "DRIVETRAIN_SLURM_CLUSTER"
"""Set to the cluster's folder in the environment of its daemons and of every command and job it starts:
how ``stop()`` and the watchdog find what is left (``slurmstepd`` and the tasks leave the daemons' tree)."""
READY_TIMEOUT = 10.0
TERMINAL_STATES = frozenset({"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
                             "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"})


class SlurmError(AssertionError):
    """A Slurm command failed or timed out, or a job did not reach a state in time (the message carries what
    the command printed, the job's record and its output). An AssertionError, so a test reports it as a failure."""


def command_path(name: str) -> str | None:
    """The absolute path of a Slurm or munge command, looking in the sbin folders too."""
    return shutil.which(name, path=_SEARCH_PATH)


def missing_commands() -> list[str]:
    return [name for name in (*DAEMONS, *CLIENTS) if command_path(name) is None]


def pmix_library() -> bool:
    """True when slurm's mpi/pmix plugin can load libpmix: it opens the ``libpmix.so`` of ``libpmix-dev``."""
    return bool(glob.glob("/usr/lib/*/pmix*/lib/libpmix.so") or glob.glob("/usr/lib/*/libpmix.so")
                or glob.glob("/usr/lib/libpmix.so"))


@functools.cache
def ensure_slurm(pmix: bool = True, timeout: float = 240.0) -> str | None:
    """Make sure Slurm and munge (and, with ``pmix``, libpmix for ``srun --mpi=pmix``) are installed.

    Installs what is missing with ``apt-get`` when this process is root (``slurm-wlm munge``: ~16 s).
    Returns None when Slurm can be used, else the reason a test should skip for. libpmix that cannot be
    installed is no reason: ``OneHostSlurm.pmix`` says whether ``--mpi=pmix`` works. Install it before a
    cluster starts: ``slurmd`` started without it hangs the first pmix step once it appears.
    """
    missing = missing_commands()
    wanted = ([*PACKAGES] if missing else []) + ([PMIX_PACKAGE] if pmix and not pmix_library() else [])
    if not wanted:
        return None
    why = None
    if os.geteuid() != 0:
        why = f"not root: cannot apt-get install {' '.join(wanted)}"
    elif command_path("apt-get") is None:
        why = f"no apt-get to install {' '.join(wanted)}"
    else:
        why = _apt_install(wanted, timeout)
        if why and missing and PMIX_PACKAGE in wanted:  # Slurm without pmix is still Slurm
            why = _apt_install(PACKAGES, timeout)
    missing = missing_commands()
    if not missing:
        return None
    return f"Slurm is not installed ({', '.join(missing)} missing) and {why or 'the install did not provide them'}"


def _apt_install(packages: Sequence[str], timeout: float) -> str | None:
    """``apt-get install`` the packages, and when that fails ``apt-get update`` and again; None or the failure.

    Bounded: ``timeout`` for everything, short network timeouts, and a wait for another apt's lock."""
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    quick = ["-o", "Acquire::http::Timeout=20", "-o", "Acquire::Retries=1", "-o", "DPkg::Lock::Timeout=120"]
    apt = command_path("apt-get") or "apt-get"
    install = [apt, "install", "-y", "-q", *quick, *packages]
    deadline = time.monotonic() + timeout
    failure = None
    for step, cmd in enumerate((install, [apt, "update", "-q", *quick], install)):
        left = deadline - time.monotonic()
        try:
            if left <= 0:
                raise subprocess.TimeoutExpired(cmd, timeout)
            done = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  timeout=left, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return f"apt-get {cmd[1]} did not finish within {timeout:.0f} s (no way to the Debian mirror?)"
        if done.returncode != 0:
            failure = (f"apt-get {cmd[1]} failed (exit {done.returncode}; no way to the Debian mirror?): "
                       + " | ".join(done.stdout.strip().splitlines()[-3:]))
            if step > 0:
                return failure
        elif cmd is install:
            return None
    return failure


# ------------------------------------------------------------------ the cluster
def _clean_env(base: Mapping[str, str]) -> dict[str, str]:
    """``base`` without the variables of a surrounding Slurm job or launcher, which would leak into ours."""
    return {k: v for k, v in base.items()
            if not k.startswith(("SLURM_", "SBATCH_", "SALLOC_", "SRUN_", "SQUEUE_", "SINFO_", "SCONTROL_",
                                 "PMIX_", "PMI_"))}


def _marked_pids(marker: str, exclude: Iterable[int] = ()) -> list[int]:
    """The processes whose environment holds ``MARKER=marker``."""
    wanted = f"{MARKER}={marker}".encode()
    skip = {os.getpid(), *exclude}
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in skip:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if wanted in f.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:
            continue
    return found


def _kill_marked(marker: str, timeout: float, exclude: Iterable[int] = ()) -> list[int]:
    """SIGKILL every process marked ``marker`` until none is left (bounded); the pids still alive."""
    deadline = time.monotonic() + timeout
    while True:
        pids = [p for p in _marked_pids(marker, exclude) if not _zombie(p)]
        if not pids or time.monotonic() > deadline:
            return pids
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.05)


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def _watchdog_main(root: str, remove: str) -> None:
    """The watchdog process: wait for EOF on stdin (the test session closed the pipe, or died), then kill what
    is left of the cluster at ``root`` (and, with ``remove == "remove"``, delete the folder)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C or a timeout's signal to the whole group
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sys.stdin.buffer.read()
    _kill_marked(root, 10.0)
    if remove == "remove":
        shutil.rmtree(root, ignore_errors=True)


_WATCHDOG = "import sys; sys.path.insert(0, sys.argv[1]); from tests._slurm import _watchdog_main; _watchdog_main(*sys.argv[2:])"


class OneHostSlurm:
    """A Slurm cluster of this one host: ``with OneHostSlurm() as cluster: cluster.run(["srun", ...])``.

    ``root``: the folder for its configuration, state, logs, sockets and job output (default: a new one in
    the temp folder, removed at the end unless ``keep``); keep it short, unix socket paths are limited to 107
    bytes. ``cpus``: the node's CPU count (default: this machine's, at least 2 so that ``srun -n 2`` fits;
    the configuration overrides the hardware). Up to 4 jobs share a CPU (``OverSubscribe=FORCE:4``).
    ``conf_extra``: lines appended to ``slurm.conf``.

    Commands run with ``SLURM_CONF`` pointing to its ``slurm.conf`` (``env()`` gives that environment for a
    test's own subprocesses); the test session's ``os.environ`` is left alone.
    """

    def __init__(self, root: str | os.PathLike[str] | None = None, cpus: int | None = None, keep: bool = False,
                 ready_timeout: float = READY_TIMEOUT, conf_extra: Sequence[str] = ()) -> None:
        self._made_root = root is None
        self.root = Path(tempfile.mkdtemp(prefix="dt-slurm-") if root is None else root).resolve()
        self.keep = keep
        self.cpus = cpus or max(os.cpu_count() or 1, 2)
        self.ready_timeout = ready_timeout
        self.conf_extra = list(conf_extra)
        self.node = socket.gethostname().split(".")[0]
        self.conf = self.root / "slurm.conf"
        self.jobs = self.root / "jobs"
        self.logs = self.root / "log"
        self.pmix = False
        self.started_in: float | None = None
        """Seconds from starting munged to the node reported idle."""
        self._procs: dict[str, subprocess.Popen] = {}
        self._watchdog: subprocess.Popen | None = None
        self._scripts = 0

    # ---------------------------------------------------------------- start and stop
    def __enter__(self) -> OneHostSlurm:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        missing = missing_commands()
        if missing:
            raise SlurmError(f"Slurm commands missing: {missing} (tests._slurm.ensure_slurm() installs them)")
        began = time.monotonic()
        try:
            self._layout()
            self.pmix = pmix_library()
            self._start_watchdog()
            self._start_munge()
            self._spawn("slurmctld", [command_path("slurmctld"), "-D", "-i", "-f", str(self.conf)])
            self._start_slurmd()
            self._wait_idle()
        except BaseException:
            self.stop()
            raise
        self.started_in = time.monotonic() - began

    def _layout(self) -> None:
        # munged refuses a socket folder that not everyone can search (mkdtemp makes 0700)
        os.chmod(self.root, 0o755)
        for sub in ("run", "state", "spool", "log", "jobs", "scripts"):
            (self.root / sub).mkdir(mode=0o755, exist_ok=True)
        (self.root / "munge").mkdir(mode=0o700, exist_ok=True)
        key = self.root / "munge" / "munge.key"
        if not key.exists():
            key.write_bytes(os.urandom(1024))
            key.chmod(0o400)
        ctld_port, d_port = free_ports(2)
        r = self.root
        lines = [
            "ClusterName=drivetrain",
            f"SlurmctldHost={self.node}(127.0.0.1)",
            f"SlurmctldPort={ctld_port}",
            f"SlurmdPort={d_port}",
            # each cluster its own job ids, so that the ports drivetrain derives from them (and the job ids in
            # file names) differ between two test sessions running at once (the suite runs two envs at a time)
            f"FirstJobId={random.SystemRandom().randrange(1000, 900000)}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={r}/run/munge.socket",
            f"StateSaveLocation={r}/state",
            f"SlurmdSpoolDir={r}/spool",
            f"SlurmctldPidFile={r}/run/slurmctld.pid",
            f"SlurmdPidFile={r}/run/slurmd.pid",
            f"SlurmctldLogFile={r}/log/slurmctld.log",
            f"SlurmdLogFile={r}/log/slurmd.log",
            f"PlugStackConfig={r}/plugstack.conf",  # not the system's /etc/slurm/plugstack.conf
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SwitchType=switch/none",
            "MpiDefault=none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "SchedulerType=sched/builtin",
            "SchedulerParameters=batch_sched_delay=0",
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none",
            "JobCompType=jobcomp/none",
            "MailProg=/bin/true",
            "JobRequeue=1",
            # seconds a step's tasks get from SIGTERM (a preemption's, a cancel's) to SIGKILL: a preempted run's
            # ranks save in them (Slurm's default: 30; at 2, one rank of a preempted run on a loaded 2-core machine
            # was killed before it had finished)
            "KillWait=10",
            "InactiveLimit=0",
            "ReturnToService=2",
            "SlurmdParameters=config_overrides",
            f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={self.cpus} State=UNKNOWN",
            f"PartitionName=debug Nodes={self.node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4",
            *self.conf_extra,
        ]
        self.conf.write_text("\n".join(lines) + "\n")
        (self.root / "plugstack.conf").write_text("")

    def _start_watchdog(self) -> None:
        """A process that kills whatever the cluster left once this one closes its pipe or dies."""
        repo = str(Path(__file__).resolve().parent.parent)
        remove = "remove" if self._made_root and not self.keep else "keep"
        with open(self.logs / "watchdog.txt", "wb") as log:
            self._watchdog = subprocess.Popen(
                [sys.executable, "-c", _WATCHDOG, repo, str(self.root), remove], stdin=subprocess.PIPE,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                env=_clean_env({k: v for k, v in os.environ.items() if k != MARKER}))

    def _start_munge(self) -> None:
        r = self.root
        self._spawn("munged", [command_path("munged"), "-F", f"--key-file={r}/munge/munge.key",
                               f"--socket={r}/run/munge.socket", f"--pid-file={r}/run/munged.pid",
                               f"--seed-file={r}/munge/munged.seed", f"--log-file={r}/log/munged.log"])
        socket_path = r / "run" / "munge.socket"
        deadline = time.monotonic() + self.ready_timeout
        while not socket_path.exists():
            self._check_alive()
            if time.monotonic() > deadline:
                raise SlurmError(f"munged made no socket within {self.ready_timeout} s:\n{self.log_tail()}")
            time.sleep(0.02)

    def _start_slurmd(self) -> None:
        self._spawn("slurmd", [command_path("slurmd"), "-D", "-N", self.node, "-f", str(self.conf)])

    def _spawn(self, name: str, cmd: list[str]) -> None:
        with open(self.logs / f"{name}.out", "ab") as out:  # the child keeps its own copy
            self._procs[name] = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                 env=self.env(), start_new_session=True)

    def _check_alive(self) -> None:
        for name, proc in self._procs.items():
            if proc.poll() is not None:
                raise SlurmError(f"{name} exited with {proc.returncode}:\n{self.log_tail()}")

    def _wait_idle(self) -> None:
        deadline = time.monotonic() + self.ready_timeout
        state = ""
        while True:
            self._check_alive()
            done = self.run(["sinfo", "-h", "-o", "%t"], timeout=5, check=False)
            state = done.stdout.strip()
            if state == "idle":
                return
            if time.monotonic() > deadline:
                raise SlurmError(f"the node is {state!r}, not idle, {self.ready_timeout} s after the start "
                                 f"({done.stderr.strip()}):\n{self.log_tail()}")
            time.sleep(0.05)

    def restart_slurmd(self) -> None:
        """Stop and start ``slurmd`` (after libpmix was installed), waiting until it registered again."""
        log = self.logs / "slurmd.log"
        starts = log.read_text(errors="replace").count("slurmd started on")
        self._stop_process("slurmd")
        self._start_slurmd()
        deadline = time.monotonic() + self.ready_timeout
        while log.read_text(errors="replace").count("slurmd started on") <= starts:  # the node stays idle meanwhile
            self._check_alive()
            if time.monotonic() > deadline:
                raise SlurmError(f"slurmd did not start again within {self.ready_timeout} s:\n{self.log_tail()}")
            time.sleep(0.05)
        self._wait_idle()
        self.pmix = pmix_library()

    def stop(self) -> None:
        """Cancel every job, stop the daemons, kill what is left of the jobs; never hangs, leaves nothing."""
        try:
            if self._procs.get("slurmctld") and self._procs["slurmctld"].poll() is None:
                try:
                    self.cancel_all()
                except SlurmError:
                    pass  # the jobs' processes are killed below all the same
            for name in ("slurmd", "slurmctld", "munged"):
                self._stop_process(name)
            _kill_marked(str(self.root), timeout=10.0, exclude=self._watchdog_pids())
        finally:
            if self._watchdog is not None:
                try:
                    self._watchdog.stdin.close()  # the watchdog finds nothing left and exits
                    self._watchdog.wait(timeout=15)
                except (OSError, subprocess.TimeoutExpired):
                    self._watchdog.kill()
                    self._watchdog.wait()
                self._watchdog = None
            if self._made_root and not self.keep:
                shutil.rmtree(self.root, ignore_errors=True)

    def _watchdog_pids(self) -> list[int]:
        return [self._watchdog.pid] if self._watchdog is not None else []

    def cancel_all(self, timeout: float = 15.0) -> None:
        """``scancel`` every job and wait until the queue is empty (bounded: KillWait is 10 s)."""
        jobs = self.queue()
        if jobs:
            self.run(["scancel", *map(str, jobs)], timeout=10, check=False)
        deadline = time.monotonic() + timeout
        while jobs and time.monotonic() < deadline:
            time.sleep(0.1)
            jobs = [j for j in self.queue() if self.job_info(j).get("JobState") not in TERMINAL_STATES]

    def _stop_process(self, name: str) -> None:
        proc = self._procs.pop(name, None)
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass  # unkillable (uninterruptible sleep): nothing more to do without hanging

    # ---------------------------------------------------------------- commands
    def env(self, extra: Mapping[str, str] | None = None, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment for a Slurm command: ``base`` (default ``os.environ``) without a surrounding job's
        Slurm variables, with ``SLURM_CONF``, the marker, and ``extra``."""
        env = _clean_env(os.environ if base is None else base)
        env["SLURM_CONF"] = str(self.conf)
        env[MARKER] = str(self.root)
        env.update(extra or {})
        return env

    def run(self, cmd: Sequence[str] | str, timeout: float = 60.0, check: bool = True,
            cwd: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None,
            input: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run ``srun``/``sbatch``/``scontrol``/``squeue``/... (a list, or a string split like a shell) with
        ``SLURM_CONF`` set (``env``: variables to add to ``env()``'s), and return what it printed (``stdout``,
        ``stderr``). A timeout, or with ``check`` an exit other than 0, raises SlurmError with the output."""
        args = shlex.split(cmd) if isinstance(cmd, str) else [str(c) for c in cmd]
        args[0] = command_path(args[0]) or args[0]
        try:
            done = subprocess.run(args, cwd=cwd, env=self.env(env), input=input, text=True, timeout=timeout,
                                  capture_output=True, stdin=None if input is not None else subprocess.DEVNULL)
        except subprocess.TimeoutExpired as e:
            raise SlurmError(f"{shlex.join(args)} did not finish within {timeout} s\nstdout: {_text(e.stdout)}\n"
                             f"stderr: {_text(e.stderr)}") from None
        if check and done.returncode != 0:
            raise SlurmError(f"{shlex.join(args)} exited with {done.returncode}\nstdout: {done.stdout}\n"
                             f"stderr: {done.stderr}")
        return done

    def sbatch(self, script: str, *options: str, cwd: str | os.PathLike[str] | None = None,
               env: Mapping[str, str] | None = None, timeout: float = 30.0) -> int:
        """Submit ``script`` (dedented; ``#!/bin/bash`` added when it has no ``#!`` line) with ``options``; the
        job id. Its output goes to ``output(job)`` (``--open-mode=append``: a requeued run adds to it) unless
        the options name another; it runs in ``cwd`` (default: the cluster's jobs folder)."""
        text = textwrap.dedent(script).lstrip("\n")
        if not text.startswith("#!"):
            text = "#!/bin/bash\n" + text
        self._scripts += 1
        path = self.root / "scripts" / f"job{self._scripts}.sh"
        path.write_text(text)
        path.chmod(0o755)
        defaults = []
        if not any(o.startswith(("-o", "--output")) for o in options):
            defaults.append(f"--output={self.jobs}/%j.out")
        if not any(o.startswith("--open-mode") for o in options):
            defaults.append("--open-mode=append")
        done = self.run(["sbatch", "--parsable", *defaults, *options, str(path)], timeout=timeout,
                        cwd=cwd or self.jobs, env=env)
        return int(done.stdout.strip().split(";")[0])

    def output(self, job_id: int) -> Path:
        """The output file of a job submitted with ``sbatch`` without ``--output``."""
        return self.jobs / f"{job_id}.out"

    def read_output(self, job_id: int) -> str:
        path = self.output(job_id)
        return path.read_text(errors="replace") if path.exists() else ""

    def queue(self) -> list[int]:
        """The ids of the jobs in the queue (pending, running, completing)."""
        done = self.run(["squeue", "-h", "-o", "%i"], timeout=10, check=False)
        return [int(line) for line in done.stdout.split() if line.isdigit()]

    def job_info(self, job_id: int) -> dict[str, str]:
        """``scontrol show job``'s fields (``JobState``, ``Reason``, ``Restarts``, ``BatchFlag``, ...); empty
        when slurmctld forgot the job (``MinJobAge``, 300 s after its end)."""
        done = self.run(["scontrol", "-o", "show", "job", str(job_id)], timeout=10, check=False)
        return dict(re.findall(r"(?:^|\s)([A-Za-z][\w:/]*)=(\S*)", done.stdout)) if done.returncode == 0 else {}

    def wait_job(self, job_id: int, states: str | Iterable[str], timeout: float = 30.0,
                 restarts: int | None = None) -> dict[str, str]:
        """Poll until the job is in one of ``states`` (``"RUNNING"``, ``{"COMPLETED", "FAILED"}``, ...) and, with
        ``restarts``, has been requeued that many times; its ``job_info``. Raises SlurmError on timeout, or
        as soon as the job ended in a state not asked for."""
        wanted = {states} if isinstance(states, str) else set(states)
        deadline = time.monotonic() + timeout
        ended_since = None
        info: dict[str, str] = {}
        while True:
            info = self.job_info(job_id)
            state = info.get("JobState", "")
            if state in wanted and (restarts is None or int(info.get("Restarts", "0")) == restarts):
                return info
            if state in TERMINAL_STATES and state not in wanted:  # a requeue passes through within a second
                ended_since = ended_since or time.monotonic()
                if time.monotonic() - ended_since > 2.0:
                    raise SlurmError(f"job {job_id} ended {state}, waiting for {sorted(wanted)}\n"
                                     f"{self.describe(job_id, info)}")
            else:
                ended_since = None
            if time.monotonic() > deadline:
                raise SlurmError(f"job {job_id} is {state or 'unknown'}, not {sorted(wanted)}"
                                 f"{'' if restarts is None else f' with {restarts} restarts'}, after {timeout} s\n"
                                 f"{self.describe(job_id, info)}")
            time.sleep(0.05)

    def wait_output(self, job_id: int, pattern: str, timeout: float = 30.0, count: int = 1) -> str:
        """Poll the job's output until the regular expression ``pattern`` matches (``count`` times, each on a
        line); the output."""
        deadline = time.monotonic() + timeout
        while True:
            text = self.read_output(job_id)
            if len(re.findall(pattern, text, re.MULTILINE)) >= count:
                return text
            if time.monotonic() > deadline:
                raise SlurmError(f"job {job_id}'s output does not show {pattern!r} {count} time(s) after {timeout} s"
                                 f"\n{self.describe(job_id)}")
            time.sleep(0.05)

    def nudge(self, job_id: int, timeout: float = 30.0) -> None:
        """Start a requeued job now: once it is PENDING again, ``scontrol update JobId=N StartTime=now``
        (otherwise it waits ~2 min for its BeginTime).

        Not within the second its previous run was killed: slurmd refuses a credential created in the second
        it revoked the job's last one (whole seconds, ``ctime <= revoked``), and the job then FAILs ("Job
        credential revoked"). The previous run was killed before the job shows PENDING, so the update waits
        for the next whole second after that (at most ~1 s)."""
        self.wait_job(job_id, "PENDING", timeout=timeout)
        pending = time.time()
        time.sleep(max(0.0, int(pending) + 1.05 - time.time()))
        self.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], timeout=10)

    def preempt_and_resume(self, script: str, started: Path, *options: str, cwd: str | os.PathLike[str] | None = None,
                           timeout: float = 180.0) -> tuple[int, str]:
        """The preemption flow of issue 40 on a job of ``script`` (``sbatch --requeue`` and ``options``): once the
        file ``started`` exists (the script writes it when training is under way), ``scancel --signal=USR1``;
        the job must requeue itself (rank 0's ``scontrol requeue``), is nudged to start again and must complete
        after exactly one restart. Returns the job id and its output (both runs: ``--open-mode=append``)."""
        job = self.sbatch(script, "--requeue", *options, cwd=cwd)
        self.wait_job(job, "RUNNING", timeout=60)
        deadline = time.monotonic() + timeout
        while not started.exists():
            if time.monotonic() > deadline or self.job_info(job).get("JobState") in TERMINAL_STATES:
                raise SlurmError(f"{started} did not appear\n{self.describe(job)}")
            time.sleep(0.1)
        self.run(["scancel", "--signal=USR1", str(job)], timeout=10)
        self.wait_job(job, "PENDING", timeout=timeout)  # requeued by rank 0 once the checkpoint was written
        time.sleep(3)  # the first run's credential is revoked a moment after the requeue: start after it
        self.nudge(job, timeout=30)
        self.wait_job(job, "COMPLETED", timeout=timeout, restarts=1)
        return job, self.read_output(job)

    def describe(self, job_id: int, info: Mapping[str, str] | None = None) -> str:
        """The job's record, its output and the daemons' logs: for a failure message."""
        info = self.job_info(job_id) if info is None else info
        fields = " ".join(f"{k}={info[k]}" for k in ("JobState", "Reason", "Restarts", "ExitCode", "StartTime")
                          if k in info)
        return f"job {job_id}: {fields or 'no record'}\n--- output:\n{self.read_output(job_id)}\n{self.log_tail()}"

    def log_tail(self, lines: int = 15) -> str:
        parts = []
        for path in sorted(self.logs.glob("*")) if self.logs.exists() else ():
            text = path.read_text(errors="replace").splitlines()[-lines:]
            if text:
                parts.append(f"--- {path.name}:\n" + "\n".join(text))
        return "\n".join(parts)


def _text(value: object) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value or "")


class _Session:
    """The session's one cluster: each test module that re-exports the fixture gets a fixture definition
    (and so a session-scoped instance) of its own, and all of them share this cluster."""

    cluster: OneHostSlurm | None = None
    users = 0
    failed: BaseException | None = None


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[OneHostSlurm]:
    """One Slurm cluster for the test session. A test module re-exports it with an assignment,
    ``slurm_cluster = _slurm.slurm_cluster`` (an import would need ``noqa: F401`` and trip ruff's F811 at
    every test that takes it as an argument). Skips with the reason where Slurm is missing and cannot be
    installed, or this is not root. Tests that use it are marked ``distributed`` and cancel their own jobs
    (``cancel_all()``) so that the next test finds the node free."""
    reason = ensure_slurm()
    if reason is None and os.geteuid() != 0:
        reason = "not root: the one-host Slurm runs slurmctld and slurmd as root (SlurmUser=root)"
    if reason is not None:
        pytest.skip(reason)
    if _Session.failed is not None:
        raise SlurmError(f"the session's Slurm cluster did not start: {_Session.failed}")
    if _Session.cluster is None:
        cluster = OneHostSlurm()
        try:
            cluster.start()
        except BaseException as e:
            _Session.failed = e
            raise
        _Session.cluster = cluster
    _Session.users += 1
    try:
        yield _Session.cluster
    finally:
        _Session.users -= 1
        if _Session.users == 0:
            cluster, _Session.cluster = _Session.cluster, None
            cluster.stop()
