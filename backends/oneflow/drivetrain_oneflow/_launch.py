"""The supervisor behind ``Trainer(..., nproc=N)`` in a plain ``python train.py``.

oneflow connects to its peers when it is imported, so a process that has already
imported oneflow alone cannot become rank 0 of a group. Instead, the process that
builds the Trainer starts N workers running the same command line (same interpreter,
same options, ``sys.orig_argv``) with the variables ``oneflow.distributed.launch``
would set, watches them, and exits with their verdict: code after ``Trainer(...)``
runs in the workers only. Hence the rules the docs spell out: the script must be safe
to run again (``if __name__ == "__main__":``), and a notebook or ``python -c`` cannot
be re-run.

Life and death:

- workers die with the supervisor (Linux ``PR_SET_PDEATHSIG``), so a killed supervisor
  leaves no orphans;
- when a worker exits with a non-zero code (an exception, ``kill -9``, an abort), the
  supervisor names it on stderr, gives the others ``timeout`` seconds to stop by
  themselves (oneflow aborts a process whose peer is lost), then kills them, and exits 1.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from typing import NoReturn

from drivetrain.backend import (
    SPAWN_PARENT_ENV,
    die_with_parent,
    exit_description,
    pump_output,
    relaunch_command,
)

from ._dist_plan import DistPlan

START_YOURSELF = "python -m oneflow.distributed.launch --nproc_per_node N train.py"

_POLL = 0.1


def free_port() -> int:
    """A TCP port nobody listens on right now (the workers' rendezvous; oneflow's master binds it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def die_with_launcher() -> None:
    """Make this worker get SIGKILL when its launcher exits (Linux), as the Trainer's own workers do.

    ``oneflow.distributed.launch`` stops the others when one fails by signalling its own
    process group, which misses them when the launcher is not a group leader (started from
    a script or a CI job); a stuck worker would then outlive everything.
    """
    die_with_parent(os.getppid())()  # the preexec function, run in this process


def worker_env(base: Mapping[str, str], world_size: int, rank: int, port: int, prefix: bool) -> dict[str, str]:
    """The environment of worker ``rank``: what ``oneflow.distributed.launch`` sets, plus our marker."""
    env = dict(base)
    env.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": str(world_size),
                "LOCAL_WORLD_SIZE": str(world_size), "RANK": str(rank), "LOCAL_RANK": str(rank),
                SPAWN_PARENT_ENV: str(os.getpid())})
    env.setdefault("OMP_NUM_THREADS", "1")
    if prefix:
        env["PYTHONUNBUFFERED"] = "1"
    return env


class Supervisor:
    """Starts the N workers, relays their output, and turns their exit codes into this process's."""

    def __init__(self, plan: DistPlan, command: list[str]) -> None:
        self.plan = plan
        self.command = command
        self.children: dict[int, subprocess.Popen] = {}
        self.codes: dict[int, int] = {}
        self.stopped: set[int] = set()
        self._pumps: list[threading.Thread] = []

    def start(self) -> None:
        port = free_port()
        prefix = self.plan.spawn_output == "prefix"
        preexec = die_with_parent(os.getpid()) if os.name == "posix" else None
        for rank in range(self.plan.world_size):
            env = worker_env(os.environ, self.plan.world_size, rank, port, prefix)
            pipe = subprocess.PIPE if prefix else None
            proc = subprocess.Popen(self.command, env=env, preexec_fn=preexec, stdout=pipe, stderr=pipe)
            self.children[rank] = proc
            if prefix:
                for stream, fd in ((proc.stdout, 1), (proc.stderr, 2)):
                    pump = threading.Thread(target=pump_output, args=(stream, fd, f"[rank {rank}] ".encode()), daemon=True)
                    pump.start()
                    self._pumps.append(pump)

    def wait(self) -> int:
        """Wait for every worker; once one fails, stop the rest after ``timeout``. The exit code to use."""
        failed_at: float | None = None
        while len(self.codes) < len(self.children):
            failed_now = []  # ranks seen failing in this poll: a peer's death often takes another down at once
            for rank, proc in self.children.items():
                if rank in self.codes:
                    continue
                code = proc.poll()
                if code is None:
                    continue
                self.codes[rank] = code
                if code != 0 and rank not in self.stopped:
                    failed_now.append(f"rank {rank} of {self.plan.world_size} {exit_description(code)}")
            if failed_now and failed_at is None:
                failed_at = time.monotonic()
                _say(f"{'; '.join(failed_now)}; the other processes stop too (killed if still running after "
                     f"oneflow_kwargs['timeout']={self.plan.timeout:g} s).")
            running = [r for r in self.children if r not in self.codes]
            if failed_at is not None and running and time.monotonic() - failed_at > self.plan.timeout:
                self.stop(running)
            time.sleep(_POLL)
        for pump in self._pumps:
            pump.join(timeout=2.0)
        failures = {r: c for r, c in self.codes.items() if c != 0}
        if not failures:
            return 0
        listed = "; ".join(f"rank {r} {exit_description(c)}" + (" (stopped by the supervisor)" if r in self.stopped
                                                                 else "") for r, c in sorted(failures.items()))
        _say(f"the distributed run failed: {listed}.")
        return 1

    def stop(self, ranks: list[int]) -> None:
        for sig, grace in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 5.0)):
            alive = [r for r in ranks if self.children[r].poll() is None]
            for rank in alive:
                self.stopped.add(rank)
                try:
                    self.children[rank].send_signal(sig)
                except OSError:
                    pass
            deadline = time.monotonic() + grace
            while alive and time.monotonic() < deadline and any(self.children[r].poll() is None for r in alive):
                time.sleep(0.05)


def supervise(plan: DistPlan) -> NoReturn:
    """Run the script as ``plan.world_size`` workers and exit this process with their verdict."""
    command = relaunch_command(START_YOURSELF)
    supervisor = Supervisor(plan, command)
    supervisor.start()
    try:
        code = supervisor.wait()
    except KeyboardInterrupt:
        supervisor.stop(list(supervisor.children))
        code = 130
    sys.stdout.flush()
    sys.stderr.flush()
    raise SystemExit(code)


def _say(text: str) -> None:
    sys.stdout.flush()
    sys.stderr.write(f"drivetrain: {text}\n")
    sys.stderr.flush()
