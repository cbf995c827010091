"""Starting the other processes of a paddle run from a plain ``python train.py``.

The machinery (re-running the command line, watching the children, naming the one
that failed) is the core's :class:`drivetrain.backend.Launcher`; what is paddle's own
is the environment: the variables ``python -m paddle.distributed.launch`` would set for
each process (its rank, the endpoints, the process group's store), on free ports of
127.0.0.1, gloo and NCCL kept on the loopback interface, and a store in a private folder
(:class:`drivetrain.backend.FolderStore`) for the start-up and exit notices and the failure
board. Unlike paddle's launcher, nothing is written to a ``./log`` folder: the children's
output goes to this process's terminal.

paddle's own ``TCPStore`` listens on every interface whatever host it is given, so the only
port such a run opens beyond loopback is the process group's store, which paddle's
``init_parallel_env`` makes itself. Where paddle's launcher started the processes, its store
also carries the failure board, through :class:`drivetrain.backend.ThreadStore`: its ``get``
waits for a missing key, it has no ``check``, and a handle is one TCP connection, not meant
to be shared between threads.
"""

from __future__ import annotations

from typing import Any

from drivetrain.backend import (
    LOCALHOST,
    FolderStore,
    Launcher,
    ThreadStore,
    free_ports,
    loopback_env,
    relaunch_command,
)

from ._dist_plan import LAUNCH_COMMAND, SPAWN_STORE_ENV

TIMEOUT_OPTION = "paddle_kwargs['timeout']"
_LAUNCHER_VARS = ("PADDLE_", "FLAGS_selected_gpus", "MASTER_ADDR", "MASTER_PORT", "POD_NAME")
_CONNECT_TIMEOUT = 10  # seconds


def paddle_store(address: tuple[str, int]) -> ThreadStore:
    """Connections to paddle's store at ``address`` (the process group's, which rank 0 hosts)."""
    from paddle.base import core

    host, port = address
    return ThreadStore(lambda: core.TCPStore(host, port, False, 1, _CONNECT_TIMEOUT), f"{host}:{port}")


def paddle_relaunch_command(**kwargs: Any) -> list[str]:
    """This program's command line, or a DriverError offering paddle's launcher instead."""
    return relaunch_command(LAUNCH_COMMAND, **kwargs)


def paddle_env(rank: int, world_size: int, ports: list[int], backend: str, gpus: list[int] | None) -> dict[str, str]:
    """The variables paddle's launcher sets for ``rank``: ``ports[0]`` is the process group's store,
    ``ports[1:world_size + 1]`` the processes' endpoints."""
    endpoints = [f"{LOCALHOST}:{p}" for p in ports[1:world_size + 1]]
    env = {
        "PADDLE_TRAINER_ID": str(rank), "PADDLE_TRAINERS_NUM": str(world_size),
        "PADDLE_TRAINER_ENDPOINTS": ",".join(endpoints), "PADDLE_CURRENT_ENDPOINT": endpoints[rank],
        "PADDLE_MASTER": f"{LOCALHOST}:{ports[0]}", "PADDLE_DISTRI_BACKEND": backend,
        "PADDLE_LOCAL_RANK": str(rank), "PADDLE_RANK_IN_NODE": str(rank), "PADDLE_LOCAL_SIZE": str(world_size),
        "PADDLE_GLOBAL_RANK": str(rank), "PADDLE_GLOBAL_SIZE": str(world_size), "PADDLE_NNODES": "1",
    }
    if gpus is not None:
        env["FLAGS_selected_gpus"] = str(gpus[rank])
    return env


def start_children(world_size: int, timeout: float, output: str, command: list[str], backend: str,
                   gpus: list[int] | None) -> tuple[Launcher, FolderStore, dict[str, str]]:
    """Make the notice store, start ranks 1..N-1 with paddle's variables.

    Returns the launcher, the store and the variables of this process (rank 0), which
    ``init_parallel_env`` reads from ``os.environ``.
    """
    ports = free_ports(world_size + 1)
    store = FolderStore.create()
    local = loopback_env()
    launcher = Launcher(world_size, timeout, output, command, timeout_option=TIMEOUT_OPTION, drop_env=_LAUNCHER_VARS)

    def child_env(rank: int) -> dict[str, str]:
        return {**paddle_env(rank, world_size, ports, backend, gpus), **local, SPAWN_STORE_ENV: store.folder}

    launcher.start(store, child_env)
    return launcher, store, {**paddle_env(0, world_size, ports, backend, gpus), **local}
