"""Starting the other processes of a paddle run from a plain ``python train.py``.

The machinery (re-running the command line, watching the children, naming the one
that failed) is the core's :class:`drivetrain.backend.Launcher`; what is paddle's own
is the environment: the variables ``python -m paddle.distributed.launch`` would set for
each process (its rank, the endpoints, the process group's store), on free ports of
127.0.0.1, and a small store this process hosts for the start-up and exit notices.
Unlike paddle's launcher, nothing is written to a ``./log`` folder: the children's
output goes to this process's terminal.
"""

from __future__ import annotations

import socket
from typing import Any

from drivetrain.backend import READY_KEY, CheckedStore, Launcher, relaunch_command

from ._dist_plan import SPAWN_STORE_ENV
from ._store import ThreadStore, host_store

PADDLE_LAUNCH = "python -m paddle.distributed.launch --nproc_per_node N --log_dir /tmp/paddle-logs train.py"
TIMEOUT_OPTION = "paddle_kwargs['timeout']"
_HOST = "127.0.0.1"
_LAUNCHER_VARS = ("PADDLE_", "FLAGS_selected_gpus", "MASTER_ADDR", "MASTER_PORT", "POD_NAME")
_STARTUP_FLOOR = 60.0


def paddle_relaunch_command(**kwargs: Any) -> list[str]:
    """This program's command line, or a DriverError offering paddle's launcher instead."""
    return relaunch_command(PADDLE_LAUNCH, **kwargs)


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports free at this moment on the loopback interface."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind((_HOST, 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def paddle_env(rank: int, world_size: int, ports: list[int], backend: str, gpus: list[int] | None) -> dict[str, str]:
    """The variables paddle's launcher sets for ``rank``: ``ports[0]`` is the process group's store,
    ``ports[1:world_size + 1]`` the processes' endpoints."""
    endpoints = [f"{_HOST}:{p}" for p in ports[1:world_size + 1]]
    env = {
        "PADDLE_TRAINER_ID": str(rank), "PADDLE_TRAINERS_NUM": str(world_size),
        "PADDLE_TRAINER_ENDPOINTS": ",".join(endpoints), "PADDLE_CURRENT_ENDPOINT": endpoints[rank],
        "PADDLE_MASTER": f"{_HOST}:{ports[0]}", "PADDLE_DISTRI_BACKEND": backend,
        "PADDLE_LOCAL_RANK": str(rank), "PADDLE_RANK_IN_NODE": str(rank), "PADDLE_LOCAL_SIZE": str(world_size),
        "PADDLE_GLOBAL_RANK": str(rank), "PADDLE_GLOBAL_SIZE": str(world_size), "PADDLE_NNODES": "1",
    }
    if gpus is not None:
        env["FLAGS_selected_gpus"] = str(gpus[rank])
    return env


def start_children(world_size: int, timeout: float, output: str, command: list[str], backend: str,
                   gpus: list[int] | None) -> tuple[Launcher, ThreadStore, dict[str, str]]:
    """Host the notice store, start ranks 1..N-1 with paddle's variables.

    Returns the launcher, the store and the variables of this process (rank 0), which
    ``init_parallel_env`` reads from ``os.environ``.
    """
    ports = free_ports(world_size + 2)
    address = (_HOST, ports[-1])
    store = ThreadStore(address, hosted=host_store(_HOST, ports[-1], max(timeout, _STARTUP_FLOOR)))
    launcher = Launcher(world_size, timeout, output, command, timeout_option=TIMEOUT_OPTION, drop_env=_LAUNCHER_VARS)

    def child_env(rank: int) -> dict[str, str]:
        return {**paddle_env(rank, world_size, ports, backend, gpus), SPAWN_STORE_ENV: f"{_HOST}:{ports[-1]}"}

    launcher.start(CheckedStore(store), child_env)
    return launcher, store, paddle_env(0, world_size, ports, backend, gpus)


def announce_ready(store: ThreadStore, rank: int) -> None:
    """Tell the parent that this spawned process reached its Trainer."""
    store.connect_here()
    CheckedStore(store).set(READY_KEY.format(rank=rank), "1")
