"""Framework-neutral machinery of distributed runs: self-launch, and naming the rank that failed.

Every distributed backend needs the same two things besides its framework's process
group, and they are written here once:

- :class:`Launcher`: ``Trainer(..., nproc=N)`` in a plain ``python train.py`` makes this
  process rank 0 and re-runs the same command line (:func:`relaunch_command`) once per
  other rank, with the environment the backend's own launcher would set (the backend
  passes it as ``child_env(rank)``). The children die with this process (Linux
  ``PR_SET_PDEATHSIG``); a monitor thread posts a child's bad exit to the store so the
  other ranks' errors name it; at exit rank 0 waits for its children, or stops them
  after a short grace when it failed itself, and exits non-zero if any failed.
- :class:`FailureBoard`: a process that raises posts one line about its exception to
  a key-value store every rank reaches, and a peer whose collective broke reads the
  board to say which rank caused it. Every access is best effort: the board helps the
  error message, it must never become a second way to hang or fail.

The store is the backend's (torch's ``TCPStore``, paddle's, ...): anything with
``set(key, value)``, ``get(key) -> bytes``, ``add(key, n) -> int`` and
``check([key]) -> bool``; :class:`CheckedStore` adds ``check`` to a store without one,
and :class:`~drivetrain._distributed.folder_store.FolderStore` needs no socket at all.
"""

from __future__ import annotations

import atexit
import ctypes
import itertools
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NoReturn, Protocol

from .._common import DriverError, TrainingTerminated
from .folder_store import FolderStore

SPAWN_PARENT_ENV = "DRIVETRAIN_SPAWN_PARENT"
"""Set in the environment of processes the Trainer started; holds the parent's pid."""

PREFIX = "drivetrain/"
READY_KEY = PREFIX + "ready/{rank}"
"""Set by a spawned process once it reached the Trainer (the launcher waits for it)."""
EXIT_KEY = PREFIX + "exit/{rank}"
"""Set by the launcher when a process it started exits with a non-zero code."""

LOCALHOST = "127.0.0.1"
LOOPBACK_INTERFACES = ("lo", "lo0")  # the loopback interface's name on Linux, on macOS and the BSDs
_PR_SET_PDEATHSIG = 1
_POLL = 0.1
_STOP_GRACE = 2.0  # seconds the children get to end by themselves once this process failed
_INTERRUPT_GRACE = 10.0  # seconds a supervisor's children get to stop after Ctrl-C (exception checkpoint, records)
_STARTUP_FLOOR = 60.0  # starting Python and importing a framework takes seconds on a loaded machine
_VOTE_CLOSED = 1 << 40  # what a process that stopped waiting takes off the failure count (see all_failed)
_generations = itertools.count()


class Store(Protocol):
    def set(self, key: str, value: str) -> None: ...
    def get(self, key: str) -> bytes: ...
    def add(self, key: str, amount: int) -> int: ...
    def check(self, keys: list[str]) -> bool: ...


class CheckedStore:
    """A store whose ``get`` blocks on a missing key and which has no ``check``: every key gets a
    counter next to it (``add(key, 0)`` reads a counter without waiting), so ``check`` can ask first."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def _handle(self) -> Any:
        """The store to talk to (:class:`ThreadStore`: this thread's connection)."""
        return self.store

    def set(self, key: str, value: str) -> None:
        """Store ``value`` under ``key`` and count the key as present for :meth:`check`."""
        store = self._handle()
        store.set(key, value)
        store.add(key + "/#", 1)

    def get(self, key: str) -> bytes:
        """The bytes under ``key``; blocks until some process sets it (ask :meth:`check` first)."""
        value = self._handle().get(key)
        return bytes(value) if not isinstance(value, bytes) else value

    def add(self, key: str, amount: int) -> int:
        """Add ``amount`` to the counter ``key`` and return its new value (``amount=0`` reads it)."""
        return int(self._handle().add(key, amount))

    def check(self, keys: list[str]) -> bool:
        """Whether every key of ``keys`` was set, without waiting."""
        return all(self._handle().add(key + "/#", 0) > 0 for key in keys)


class ThreadStore(CheckedStore):
    """A :class:`CheckedStore` over a store whose handle is one connection, not to be shared between threads
    (paddle's ``TCPStore``): each thread gets its own from ``connect()``.

    Connecting to a store whose host died may retry forever, while a connection made before fails at
    once; so a thread connects only through :meth:`connect_here`, called while every process is alive,
    and a thread that did not is refused (the board then just names no rank). ``hosted`` is this
    process's own server: it is kept alive, serves as the creating thread's connection, and any thread
    may connect to it later (it cannot be gone). ``where`` names the store in errors.
    """

    def __init__(self, connect: Callable[[], Any], where: str, hosted: Any = None) -> None:
        super().__init__(hosted)
        self.where = where
        self._connect = connect
        self._local = threading.local()
        self._local.conn = hosted

    def connect_here(self) -> None:
        """Open the calling thread's connection now (best effort)."""
        if getattr(self._local, "conn", None) is None:
            try:
                self._local.conn = self._connect()
            except Exception:  # noqa: BLE001 - without it, errors just name no rank
                self._local.conn = None

    def _handle(self) -> Any:
        if getattr(self._local, "conn", None) is None and self.store is not None:
            self.connect_here()
        conn = getattr(self._local, "conn", None)
        if conn is None:
            raise ConnectionError(f"this thread has no connection to the store at {self.where}")
        return conn


# ------------------------------------------------------------------ descriptions
def exit_description(code: int) -> str:
    """``exited with code 3`` / ``was killed by SIGKILL (exit code -9)``."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name} (exit code {code})"
    return f"exited with code {code}"


def stop_signal(exc: BaseException | None) -> int | None:
    """The signal behind ``exc`` when it is how a run is stopped (SIGINT: KeyboardInterrupt; SIGTERM:
    :class:`~drivetrain.TrainingTerminated`), else None."""
    if isinstance(exc, KeyboardInterrupt):
        return int(signal.SIGINT)
    return exc.signum if isinstance(exc, TrainingTerminated) else None


def exception_summary(exc: BaseException | None) -> str:
    """One line about ``exc`` for the other processes' error messages."""
    if exc is None:
        return "failed"
    if isinstance(exc, KeyboardInterrupt):
        return "was interrupted (KeyboardInterrupt)"
    text = str(exc).strip().splitlines()
    first = text[0][:300] if text else ""
    return f"raised {type(exc).__name__}" + (f": {first}" if first else "")


# ------------------------------------------------------------------ the board
class FailureBoard:
    """Failure notices of one driver's run; ``generation`` keeps a later Trainer in the same
    processes from reading an earlier one's notices (by default, the number of boards this
    process made before: every rank makes them in the same order)."""

    def __init__(self, store: Store, rank: int, world_size: int, generation: int | None = None) -> None:
        self.store = store
        self.rank = rank
        self.world_size = world_size
        if generation is None:
            generation = next(_generations)
        self._failed = f"{PREFIX}{generation}/failed/{{rank}}"
        self._count = f"{PREFIX}{generation}/failed_count"

    def post_failure(self, summary: str) -> None:
        """Tell the other ranks that this one failed and why (``summary``); quietly does nothing when the
        store is already gone."""
        try:
            self.store.set(self._failed.format(rank=self.rank), summary)
        except Exception:  # noqa: BLE001 - the store may be gone with a dead peer: the message is a nicety
            pass

    def all_failed(self, grace: float) -> bool:
        """Count this process as failed; True when every process failed within ``grace`` seconds.

        Then they all stand in the same place (an exception on every rank, Ctrl-C) and can
        still run collectives together, e.g. to save a checkpoint on the way out. A process
        that gives up waiting closes the vote (it takes :data:`_VOTE_CLOSED` off the count, in
        the same atomic ``add`` every rank uses), so one failing later learns that the others
        no longer wait for it: every process reaches the same verdict.
        """
        try:
            count = self.store.add(self._count, 1)
            deadline = time.monotonic() + grace
            while 0 < count < self.world_size and time.monotonic() < deadline:
                time.sleep(0.05)
                count = self.store.add(self._count, 0)
            if 0 < count < self.world_size:
                count = self.store.add(self._count, -_VOTE_CLOSED) + _VOTE_CLOSED  # another may just have come
        except Exception:  # noqa: BLE001
            return False
        return count >= self.world_size

    def reports(self, wait: float = 0.0) -> dict[int, str]:
        """``{rank: what happened}`` for every other process that posted, polling up to ``wait`` seconds."""
        deadline = time.monotonic() + wait
        while True:
            found = self._read()
            if found or time.monotonic() >= deadline:
                return found
            time.sleep(0.1)

    def _read(self) -> dict[int, str]:
        found: dict[int, str] = {}
        try:
            for rank in range(self.world_size):
                if rank == self.rank:
                    continue
                posted = [self._get(key.format(rank=rank)) for key in (self._failed, EXIT_KEY)]
                parts = [p for p in posted if p]
                if parts:
                    found[rank] = "; ".join(parts)
        except Exception:  # noqa: BLE001 - e.g. the store was hosted by the process that died
            return found
        return found

    def _get(self, key: str) -> str | None:
        if not self.store.check([key]):  # check does not block; get would wait for a missing key
            return None
        return self.store.get(key).decode("utf-8", "replace")


# ------------------------------------------------------------------ self-launch
def why_not_rerunnable(argv: list[str] | None = None, main: Any = None) -> str | None:
    """Why this program cannot be run again from its command line (a notebook, ``python -c``, pytest), or None."""
    argv = sys.argv if argv is None else argv
    main = sys.modules.get("__main__") if main is None else main
    main_file = getattr(main, "__file__", None)
    if "ipykernel" in sys.modules or (main_file is None and argv and argv[0] not in ("-c", "-")):
        return "this is an interactive session or a notebook, which has no script to run again"
    if not argv or argv[0] in ("-c", "-") or main_file is None:
        return "the program was given as a string (python -c) or on stdin, which cannot be run again"
    if os.path.basename(os.path.dirname(os.path.abspath(main_file))) == "pytest" or \
            os.path.basename(argv[0]).startswith(("pytest", "py.test")):
        return "it runs under pytest, and re-running the test session in every process is not what you want"
    return None


def relaunch_command(start_yourself: str, argv: list[str] | None = None, orig_argv: list[str] | None = None,
                     main: Any = None) -> list[str]:
    """The command line that runs this program again, or a DriverError saying why it cannot be re-run.

    ``start_yourself`` is the framework's own launch command, offered as the alternative
    (e.g. ``"torchrun --nproc_per_node N train.py"``).
    """
    argv = sys.argv if argv is None else argv
    orig_argv = list(getattr(sys, "orig_argv", [sys.executable, *argv])) if orig_argv is None else orig_argv
    why = why_not_rerunnable(argv, main)
    if why is not None:
        raise DriverError(
            "distributed training with nproc>1 or several devices starts the other processes by running this "
            f"program's command line again, but {why}. Put the training in a script guarded by "
            "if __name__ == '__main__': and run it with python train.py, or start the processes yourself: "
            f"{start_yourself}."
        )
    return [sys.executable, *orig_argv[1:]]


def _libc() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def die_with_parent(parent_pid: int, signum: int = signal.SIGKILL) -> Any:
    """A ``preexec_fn`` making the child receive ``signum`` (SIGKILL) when this process dies (Linux only)."""
    libc = _libc()  # loaded before the fork: nothing is loaded in the child

    def preexec() -> None:
        if libc is not None:
            libc.prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os._exit(1)

    return preexec


def startup_patience(timeout: float) -> float:
    """How long starting the processes may take: ``timeout``, but at least a minute (starting Python and
    importing a framework takes seconds on a loaded machine, and a tight collective timeout must not fail it)."""
    return max(timeout, _STARTUP_FLOOR)


def free_ports(count: int, host: str = LOCALHOST) -> list[int]:
    """``count`` distinct TCP ports nobody listens on right now (for a rendezvous on this machine)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind((host, 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def loopback_env() -> dict[str, str]:
    """The variables that keep gloo's and NCCL's sockets of a run on this machine on the loopback interface.

    Both listen on the address the host name resolves to unless told an interface, and that address is
    usually the machine's network address; every process of a self-launched run is on this machine, so
    the network never needs to reach them. Empty where no loopback interface is found by name.
    """
    try:
        names = {name for _, name in socket.if_nameindex()}
    except (OSError, AttributeError):  # no interface list on this platform
        return {}
    interface = next((name for name in LOOPBACK_INTERFACES if name in names), None)
    return {} if interface is None else {"GLOO_SOCKET_IFNAME": interface, "NCCL_SOCKET_IFNAME": interface}


def local_launch_env(rank: int, world_size: int, port: int) -> dict[str, str]:
    """The variables ``torchrun``-style launchers set for ``rank`` of a run on this machine whose
    rendezvous is ``port`` on 127.0.0.1 (``MASTER_ADDR``/``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``, ...)."""
    return {"MASTER_ADDR": LOCALHOST, "MASTER_PORT": str(port), "WORLD_SIZE": str(world_size),
            "LOCAL_WORLD_SIZE": str(world_size), "RANK": str(rank), "LOCAL_RANK": str(rank)}


class Launcher:
    """The processes of ranks 1..N-1, started and watched by rank 0 (:meth:`start`), or of every rank,
    started and watched by a process that only supervises them (:meth:`supervise`).

    ``timeout_option`` names the option that sets ``timeout`` (e.g.
    ``"torch_kwargs['timeout']"``), for the messages. ``drop_env`` lists prefixes of
    variables not passed on (those of a launcher this process may itself run under).
    ``mark_children=False`` leaves :data:`SPAWN_PARENT_ENV` out of the children's environment: they
    join as a framework launcher's processes would (the processes of a Slurm task's ``nproc=``).
    """

    def __init__(self, world_size: int, timeout: float, output: str, command: list[str], *,
                 timeout_option: str, drop_env: tuple[str, ...] = (), mark_children: bool = True) -> None:
        self.world_size = world_size
        self.mark_children = mark_children
        self.timeout = timeout
        self.output = output
        self.command = command
        self.timeout_option = timeout_option
        self.drop_env = drop_env
        self.store: Store | None = None
        self.children: dict[int, subprocess.Popen] = {}
        self.exit_codes: dict[int, int] = {}
        self._stopped: set[int] = set()  # ranks this launcher terminated itself
        self._failed = False  # this process failed in training
        self._exiting = False  # this process reached its exit handler
        self._pumps: list[threading.Thread] = []
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ starting
    def start(self, store: Store | None, child_env: Callable[[int], Mapping[str, str]],
              ranks: Iterable[int] | None = None) -> None:
        """Start ``ranks`` (default 1..N-1) with this environment plus ``child_env(rank)``; ``store`` is the run's
        store (a :class:`FolderStore` is removed at exit, once every child ended), or None where the children
        meet in the framework's own (no :meth:`wait_ready`, no exit notices: their exit codes name them)."""
        self.store = store
        atexit.register(self._at_exit)
        self._spawn(range(1, self.world_size) if ranks is None else ranks, child_env)
        threading.Thread(target=self._monitor, name="drivetrain-monitor", daemon=True).start()

    def supervise(self, child_env: Callable[[int], Mapping[str, str]]) -> NoReturn:
        """Run every rank (0..N-1) as a child and exit this process with their verdict.

        For a framework that joins its peers when it is imported (oneflow), so that this
        process cannot become rank 0: it only supervises. When a child fails, it is named
        on stderr, the others get ``timeout`` seconds to stop by themselves and are then
        killed, and this process exits with code 1 (0 when every child succeeded, 130 on Ctrl-C).
        """
        _reassert_sigint()
        self._spawn(range(self.world_size), child_env)
        try:
            self._wait_children(announce=True)
        except KeyboardInterrupt:  # Ctrl-C: every rank stops as it would alone (records, exception checkpoint)
            self.pass_on(signal.SIGINT)
            self._wait_stopped(_INTERRUPT_GRACE)
            _flush()
            raise SystemExit(130) from None
        self._join_pumps()
        failed = {r: c for r, c in sorted(self.exit_codes.items()) if c != 0}
        if failed:
            listed = "; ".join(f"rank {r} {exit_description(c)}" + (" (stopped by the supervisor)"
                                                                     if r in self._stopped else "")
                               for r, c in failed.items())
            _say(f"the distributed run failed: {listed}.")
        _flush()
        raise SystemExit(1 if failed else 0)

    def _spawn(self, ranks: Iterable[int], child_env: Callable[[int], Mapping[str, str]]) -> None:
        """Start ``ranks`` running the command; they die with this process (Linux)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(self.drop_env)} if self.drop_env \
            else dict(os.environ)
        if self.mark_children:
            env[SPAWN_PARENT_ENV] = str(os.getpid())
        piped = self.output == "prefix"
        if piped:
            env["PYTHONUNBUFFERED"] = "1"
        preexec = die_with_parent(os.getpid()) if os.name == "posix" else None
        for rank in ranks:
            proc = subprocess.Popen(
                self.command, env={**env, **child_env(rank)}, preexec_fn=preexec,
                stdout=subprocess.PIPE if piped else None, stderr=subprocess.PIPE if piped else None,
            )
            self.children[rank] = proc
            if piped:
                for stream, fd in ((proc.stdout, 1), (proc.stderr, 2)):
                    pump = threading.Thread(target=pump_output, args=(stream, fd, f"[rank {rank}] ".encode()),
                                            name=f"drivetrain-rank{rank}-output", daemon=True)
                    pump.start()
                    self._pumps.append(pump)

    def wait_ready(self) -> None:
        """Wait until every child reached its Trainer (set :data:`READY_KEY`); fail at once if one exits first.

        A child that dies is noticed at once; one that never gets there is given the
        timeout, but at least a minute, since a tight collective timeout must not make
        a slow start-up fail.
        """
        assert self.store is not None, "start() first"
        patience = startup_patience(self.timeout)
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
                    f"or raise {self.timeout_option} if the start-up is that slow."
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

    def pass_on(self, signum: int) -> None:
        """This process was stopped by ``signum`` (Ctrl-C, SIGTERM): send it to the children still running,
        as the frameworks' launchers do, so every rank stops now (a rank that got it from the terminal too
        ignores the repeat, see :mod:`drivetrain._loop.signals`). They count as stopped, not failed."""
        for rank in self._running():
            self._stopped.add(rank)
            try:
                self.children[rank].send_signal(signum)
            except OSError:
                pass

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
                        if self.store is not None:  # set by start(), which starts this thread
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
        stop it all, as the frameworks' launchers stop every process once one fails."""
        listed = "; ".join(f"rank {r} {what}" for r, what in sorted(self.failures().items()))
        _say(f"{listed}, and rank 0 (this process) is still running {self.timeout:g} s later without having "
             "noticed (it is not waiting in any collective operation); stopping every process. Raise "
             f"{self.timeout_option} if rank 0 legitimately works alone that long.")
        self._stop(self._running())
        self._remove_folder()
        os._exit(1)

    # ------------------------------------------------------------------ ending
    def _stop(self, ranks: list[int]) -> None:
        """SIGTERM, then SIGKILL for those still running 3 s later; a rank already given a stop signal
        (:meth:`pass_on`) had its grace and gets SIGKILL at once."""
        for sig, grace in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 5.0)):
            alive = [r for r in ranks if self.children[r].poll() is None
                     and not (sig == signal.SIGTERM and r in self._stopped)]
            if not alive:
                continue
            for r in alive:
                self._stopped.add(r)
                try:
                    self.children[r].send_signal(sig)
                except OSError:
                    pass
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline and any(self.children[r].poll() is None for r in alive):
                time.sleep(0.05)

    def _wait_stopped(self, grace: float) -> None:
        """Give the children sent a stop signal ``grace`` seconds to end, then kill those still running."""
        deadline = time.monotonic() + grace
        while self._running() and time.monotonic() < deadline:
            time.sleep(0.05)
        self._stop(self._running())
        self._collect()

    def _running(self) -> list[int]:
        return [r for r in self.children if self.children[r].poll() is None]

    def _wait_children(self, announce: bool = False) -> None:
        """Wait for every child; once one fails (or this process did), stop the rest after a grace.
        ``announce``: name the failed children on stderr as soon as they are seen."""
        failed_at: float | None = time.monotonic() if self._failed else None
        while True:
            self._collect()
            if failed_at is None and any(c != 0 for c in self.exit_codes.values()):
                failed_at = time.monotonic()
                if announce:
                    listed = "; ".join(f"rank {r} of {self.world_size} {what}"
                                       for r, what in sorted(self.failures().items()))
                    _say(f"{listed}; the other processes stop too (killed if still running after "
                         f"{self.timeout_option}={self.timeout:g} s).")
            running = [r for r in self.children if r not in self.exit_codes]
            if not running:
                return
            grace = _STOP_GRACE if self._failed else self.timeout
            if failed_at is not None and time.monotonic() - failed_at > grace:
                self._stop(running)
                self._collect()
                return
            time.sleep(_POLL)

    def _join_pumps(self) -> None:
        for pump in self._pumps:
            pump.join(timeout=2.0)

    def _at_exit(self) -> None:
        self._exiting = True
        try:
            self._wait_children()
        except KeyboardInterrupt:
            self._stop(self._running())
        self._join_pumps()
        self._remove_folder()
        failures = self.failures()
        if failures:
            listed = "; ".join(f"rank {r} {what}" for r, what in sorted(failures.items()))
            _say(f"a process started by the Trainer failed: {listed}.")
            os._exit(1)

    def _remove_folder(self) -> None:
        """Delete the run's :class:`FolderStore` (every child ended; this process is leaving)."""
        if isinstance(self.store, FolderStore):
            self.store.remove()


def _reassert_sigint() -> None:
    """Make Python's own SIGINT handler the process's again, if Python's is the one it believes it has.

    A framework's runtime may replace the handler underneath Python when it is imported (oneflow's
    exits with status 255 at once), so that Ctrl-C would end a supervisor without a word and leave its
    ranks unsupervised; setting Python's handler again makes Ctrl-C a KeyboardInterrupt once more.
    """
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _flush() -> None:
    sys.stdout.flush()
    sys.stderr.flush()


def _say(text: str) -> None:
    """One ``drivetrain: ...`` line on stderr, after what this process printed so far."""
    sys.stdout.flush()
    sys.stderr.write(f"drivetrain: {text}\n")
    sys.stderr.flush()


def pump_output(stream: Any, fd: int, prefix: bytes) -> None:
    """Copy a child's output line by line to this process's ``fd``, each line prefixed."""
    try:
        for line in iter(stream.readline, b""):
            os.write(fd, prefix + line)
    except OSError:
        pass
    finally:
        stream.close()
