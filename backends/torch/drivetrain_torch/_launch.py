"""Starting the other processes of a distributed run from a plain ``python train.py``.

``Trainer(..., nproc=2)`` (or ``device=[0, 1]``) in a script that was not started by
torchrun makes this process rank 0 and re-runs the same command line (the same
interpreter and interpreter options, ``sys.orig_argv``) once per other rank, with the
variables torchrun would set. Those processes run the script from the top, reach the
same ``Trainer(...)`` and join as ranks 1..N-1. Hence the rules the docs spell out:
the script must be safe to run N times (``if __name__ == "__main__":``, no side
effects at import), and a notebook or ``python -c`` cannot be re-run.

Life and death:

- the children die with this process (Linux ``PR_SET_PDEATHSIG``), so a killed parent
  leaves no orphans;
- a monitor thread notices a child exiting with a non-zero code and posts it to the
  store, so the other ranks' errors name it;
- at exit this process waits for its children (they finish the script too); if any
  failed it reports which and exits non-zero; if this process itself failed in
  training, it stops them after a short grace instead of waiting.
"""

from __future__ import annotations

import atexit
import ctypes
import datetime
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from drivetrain._errors import DriverError

from ._dist_plan import SPAWN_PARENT_ENV
from ._failures import EXIT_KEY, READY_KEY, exit_description

_PR_SET_PDEATHSIG = 1
_POLL = 0.1
_STOP_GRACE = 2.0  # seconds the children get to end by themselves once this process failed
_STARTUP_FLOOR = 60.0  # starting Python and importing torch takes seconds on a loaded machine


def relaunch_command(argv: list[str] | None = None, orig_argv: list[str] | None = None,
                     main: Any = None) -> list[str]:
    """The command line that runs this program again, or a DriverError saying why it cannot be re-run."""
    argv = sys.argv if argv is None else argv
    orig_argv = list(getattr(sys, "orig_argv", [sys.executable, *argv])) if orig_argv is None else orig_argv
    main = sys.modules.get("__main__") if main is None else main
    main_file = getattr(main, "__file__", None)
    why = None
    if "ipykernel" in sys.modules or (main_file is None and argv and argv[0] not in ("-c", "-")):
        why = "this is an interactive session or a notebook, which has no script to run again"
    elif not argv or argv[0] in ("-c", "-") or main_file is None:
        why = "the program was given as a string (python -c) or on stdin, which cannot be run again"
    elif os.path.basename(os.path.dirname(os.path.abspath(main_file))) == "pytest" or \
            os.path.basename(argv[0]).startswith(("pytest", "py.test")):
        why = "it runs under pytest, and re-running the test session in every process is not what you want"
    if why is not None:
        raise DriverError(
            "distributed training with nproc>1 or several devices starts the other processes by running this "
            f"program's command line again, but {why}. Put the training in a script guarded by "
            "if __name__ == '__main__': and run it with python train.py, or start the processes yourself: "
            "torchrun --nproc_per_node N train.py."
        )
    return [sys.executable, *orig_argv[1:]]


def _libc() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def _die_with_parent(parent_pid: int) -> Any:
    """A ``preexec_fn`` making the child receive SIGKILL when this process dies (Linux only)."""
    libc = _libc()  # loaded before the fork: nothing is loaded in the child

    def preexec() -> None:
        if libc is not None:
            libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os._exit(1)

    return preexec


class Launcher:
    """The processes of ranks 1..N-1, started and watched by rank 0."""

    def __init__(self, world_size: int, timeout: float, output: str, command: list[str]) -> None:
        self.world_size = world_size
        self.timeout = timeout
        self.output = output
        self.command = command
        self.store: Any = None
        self.children: dict[int, subprocess.Popen] = {}
        self.exit_codes: dict[int, int] = {}
        self._stopped: set[int] = set()  # ranks this launcher terminated itself
        self._failed = False  # this process failed in training
        self._exiting = False  # this process reached its exit handler
        self._pumps: list[threading.Thread] = []
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ starting
    def start(self) -> Any:
        """Open the rendezvous store on a free port, start the children; return the store."""
        import torch.distributed as dist

        self.store = dist.TCPStore("127.0.0.1", 0, self.world_size, is_master=True,
                                   timeout=datetime.timedelta(seconds=self.timeout), wait_for_workers=False)
        env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHELASTIC_")}
        env.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(self.store.port),
                    "WORLD_SIZE": str(self.world_size), "LOCAL_WORLD_SIZE": str(self.world_size),
                    "GROUP_RANK": "0", SPAWN_PARENT_ENV: str(os.getpid())})
        piped = self.output == "prefix"
        if piped:
            env["PYTHONUNBUFFERED"] = "1"
        preexec = _die_with_parent(os.getpid()) if os.name == "posix" else None
        atexit.register(self._at_exit)
        for rank in range(1, self.world_size):
            child_env = dict(env, RANK=str(rank), LOCAL_RANK=str(rank), ROLE_RANK=str(rank))
            proc = subprocess.Popen(
                self.command, env=child_env, preexec_fn=preexec,
                stdout=subprocess.PIPE if piped else None, stderr=subprocess.PIPE if piped else None,
            )
            self.children[rank] = proc
            if piped:
                for stream, fd in ((proc.stdout, 1), (proc.stderr, 2)):
                    pump = threading.Thread(target=_pump, args=(stream, fd, f"[rank {rank}] ".encode()),
                                            name=f"drivetrain-rank{rank}-output", daemon=True)
                    pump.start()
                    self._pumps.append(pump)
        threading.Thread(target=self._monitor, name="drivetrain-monitor", daemon=True).start()
        return self.store

    def wait_ready(self) -> None:
        """Wait until every child reached its Trainer; fail at once if one exits first.

        A child that dies is noticed at once; one that never gets there is given the
        timeout, but at least a minute, since a tight collective timeout must not make
        a slow start-up fail.
        """
        patience = max(self.timeout, _STARTUP_FLOOR)
        deadline = time.monotonic() + patience
        waiting = set(self.children)
        while waiting:
            waiting = {r for r in waiting if not self.store.check([READY_KEY.format(rank=r)])}
            dead = {r: code for r in waiting if (code := self.children[r].poll()) is not None}
            if dead:
                listed = "; ".join(f"rank {r} {exit_description(c)}" for r, c in sorted(dead.items()))
                raise DriverError(
                    f"the processes this Trainer started did not all reach Trainer(...): {listed} (its output above "
                    "says why). Everything before Trainer(...) runs in every process: it must not depend on "
                    "being the first process, and must be guarded by if __name__ == '__main__':."
                )
            if waiting and time.monotonic() > deadline:
                raise DriverError(
                    f"rank(s) {sorted(waiting)} did not reach Trainer(...) within {patience:g} s. Every process "
                    "runs the script from the top: make sure each one builds the Trainer with the same arguments, "
                    "or raise torch_kwargs['timeout'] if the start-up is that slow."
                )
            if waiting:
                time.sleep(0.05)

    # ---------------------------------------------------------------- watching
    def failures(self) -> dict[int, str]:
        """``{rank: 'exited with code 1'}`` for every child that ended badly so far."""
        self._collect()
        return {r: exit_description(c) for r, c in self.exit_codes.items() if c != 0 and r not in self._stopped}

    def note_failed(self) -> None:
        """This process failed in training: at exit, stop the children instead of waiting for them."""
        self._failed = True

    def _collect(self) -> list[tuple[int, int]]:
        """Record children that exited since the last call; return them."""
        ended = []
        with self._lock:
            for rank, proc in self.children.items():
                if rank not in self.exit_codes and (code := proc.poll()) is not None:
                    self.exit_codes[rank] = code
                    ended.append((rank, code))
        return ended

    def _monitor(self) -> None:
        """Post failed children to the store; stop everything if this process ignores a failure too long."""
        failed_at: float | None = None
        while True:
            for rank, code in self._collect():
                if code != 0 and rank not in self._stopped:
                    failed_at = failed_at or time.monotonic()
                    try:
                        self.store.set(EXIT_KEY.format(rank=rank), exit_description(code))
                    except Exception:  # noqa: BLE001 - a nicety for the other ranks' messages
                        pass
            settled = self._failed or self._exiting
            if failed_at is not None and not settled and time.monotonic() - failed_at > self.timeout:
                self._abandon()
                return
            if len(self.exit_codes) == len(self.children) and (failed_at is None or settled):
                return
            time.sleep(_POLL)

    def _abandon(self) -> None:
        """A child failed and this process has not noticed within ``timeout`` (it is in no collective):
        stop it all, as torchrun stops every process once one fails."""
        listed = "; ".join(f"rank {r} {what}" for r, what in sorted(self.failures().items()))
        sys.stderr.write(
            f"drivetrain: {listed}, and rank 0 (this process) is still running {self.timeout:g} s later without "
            "having noticed (it is not waiting in any collective operation); stopping every process. Raise "
            "torch_kwargs['timeout'] if rank 0 legitimately works alone that long.\n"
        )
        sys.stderr.flush()
        self._stop([r for r in self.children if self.children[r].poll() is None])
        os._exit(1)

    # ------------------------------------------------------------------ ending
    def _stop(self, ranks: list[int]) -> None:
        for sig, grace in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 5.0)):
            alive = [r for r in ranks if self.children[r].poll() is None]
            if not alive:
                return
            for r in alive:
                self._stopped.add(r)
                try:
                    self.children[r].send_signal(sig)
                except OSError:
                    pass
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline and any(self.children[r].poll() is None for r in alive):
                time.sleep(0.05)

    def _wait_children(self) -> None:
        """Wait for every child; once one fails (or this process did), stop the rest after a grace."""
        failed_at: float | None = time.monotonic() if self._failed else None
        while True:
            self._collect()
            running = [r for r in self.children if r not in self.exit_codes]
            if not running:
                return
            if failed_at is None and any(c != 0 for c in self.exit_codes.values()):
                failed_at = time.monotonic()
            grace = _STOP_GRACE if self._failed else self.timeout
            if failed_at is not None and time.monotonic() - failed_at > grace:
                self._stop(running)
                self._collect()
                return
            time.sleep(_POLL)

    def _at_exit(self) -> None:
        self._exiting = True
        try:
            self._wait_children()
        except KeyboardInterrupt:
            self._stop([r for r in self.children if self.children[r].poll() is None])
        for pump in self._pumps:
            pump.join(timeout=2.0)
        failures = self.failures()
        if failures:
            listed = "; ".join(f"rank {r} {what}" for r, what in sorted(failures.items()))
            sys.stdout.flush()
            sys.stderr.write(f"drivetrain: a process started by the Trainer failed: {listed}.\n")
            sys.stderr.flush()
            os._exit(1)


def _pump(stream: Any, fd: int, prefix: bytes) -> None:
    """Copy a child's output line by line to this process's ``fd``, each line prefixed."""
    try:
        for line in iter(stream.readline, b""):
            os.write(fd, prefix + line)
    except OSError:
        pass
    finally:
        stream.close()
