"""Starting, killing and waiting for the kill -9 child: one process, or a job of several (spawned or mpirun).

Each start is a new session, so that every process it starts (the Trainer's spawned ranks, mpirun's ranks)
can be found (``/proc``, :func:`tests._dist_helpers.session_pids`) and none outlives the test. Its output goes
to a log file, not a pipe: a rank that lingers after its launcher died must not keep the parent reading.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from dataclasses import dataclass

from .._dist_helpers import alive, session_pids


class Kill9Failure(AssertionError):
    pass


@dataclass
class Job:
    """A started command: its first process (the session leader), its log, and where its ranks write their pids."""

    proc: subprocess.Popen
    log: str
    pid_dir: str | None
    started: float  # unix time

    @classmethod
    def start(cls, cmd: list[str], env: dict[str, str], log: str, pid_dir: str | None) -> Job:
        with open(log, "wb") as out:
            # stdin from /dev/null: mpirun forwards its stdin to rank 0 and would read the caller's away
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)
        return cls(proc, log, pid_dir, time.time())

    def output(self) -> str:
        with open(self.log, errors="replace") as f:
            return f.read()

    def processes(self) -> list[int]:
        """Every process of the job still running (zombies left out)."""
        return [pid for pid in session_pids(self.proc.pid) if alive(pid)]

    def rank_pids(self) -> dict[int, int]:
        """{rank: pid} of the ranks that wrote their pid and still run."""
        found: dict[int, int] = {}
        if self.pid_dir is None or not os.path.isdir(self.pid_dir):
            return found
        running = set(self.processes())
        for entry in os.listdir(self.pid_dir):
            if entry.startswith("rank") and entry[4:].isdigit():
                with open(os.path.join(self.pid_dir, entry)) as f:
                    pid = int(f.read())
                if pid in running:
                    found[int(entry[4:])] = pid
        return found

    def kill_job(self) -> None:
        """SIGKILL every process of the job at once (its process group, then any that left it)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except OSError:
            pass
        for pid in session_pids(self.proc.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass

    def kill(self, rng: random.Random, rank_share: float) -> str:
        """SIGKILL the whole job, or with probability ``rank_share`` one random rank that runs (the whole job when
        none wrote its pid yet); return what was killed: ``job`` or ``rank<r>``."""
        ranks = self.rank_pids() if rng.random() < rank_share else {}
        if not ranks:
            self.kill_job()
            return "job"
        rank = rng.choice(sorted(ranks))
        os.kill(ranks[rank], signal.SIGKILL)
        return f"rank{rank}"

    def wait_all_gone(self, bound: float) -> float:
        """Wait until every process of the job ended; return how long that took. Past ``bound`` seconds the
        rest are killed and :class:`Kill9Failure` names them."""
        start = time.monotonic()
        while True:
            if self.proc.poll() is None:
                try:
                    self.proc.wait(timeout=0.05)
                except subprocess.TimeoutExpired:
                    pass
            left = self.processes()
            if not left and self.proc.poll() is not None:
                return time.monotonic() - start
            if time.monotonic() - start > bound:
                self.kill_job()
                self.proc.wait()
                raise Kill9Failure(f"processes {left} of the job still ran {bound:.0f} s after the kill "
                                   f"(the watchdog should have ended them):\n{self.output()[-3000:]}")
            time.sleep(0.05)
