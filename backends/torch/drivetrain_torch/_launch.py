"""Starting the other processes of a torch run from a plain ``python train.py``.

The machinery (re-running the command line, watching the children, naming the one
that failed) is the core's :mod:`drivetrain.backend` launcher; what is torch's own is
the rendezvous: a ``TCPStore`` on a free port of 127.0.0.1 hosted by this process
(rank 0), and the variables torchrun would set for each child.

Every process of such a run is on this machine, so none listens beyond loopback: the
store serves a socket bound to 127.0.0.1 (torch's own server would bind every
interface), and gloo and NCCL are told the loopback interface (:func:`drivetrain.backend.loopback_env`).
"""

from __future__ import annotations

import datetime
import os
import socket
from typing import Any

from drivetrain.backend import LOCALHOST, Launcher, local_launch_env, loopback_env, relaunch_command

TORCHRUN = "torchrun --nproc_per_node N train.py"
TIMEOUT_OPTION = "torch_kwargs['timeout']"


def torch_relaunch_command(**kwargs: Any) -> list[str]:
    """This program's command line, or a DriverError offering torchrun instead."""
    return relaunch_command(TORCHRUN, **kwargs)


def loopback_store(world_size: int, timeout: float) -> Any:
    """A ``TCPStore`` server on a free port that listens on 127.0.0.1 only.

    torch's server binds every interface whatever host it is given, but serves a socket handed
    to it (``master_listen_fd``); the libuv server takes one from torch 2.8 on (pytorch#150215),
    the classic server before.
    """
    import torch
    from torch import distributed as dist

    older = {"use_libuv": False} if (2, 4) <= torch.__version__ < (2, 8) else {}  # libuv: the default from 2.4
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((LOCALHOST, 0))
        sock.listen(socket.SOMAXCONN)
        store = dist.TCPStore(LOCALHOST, sock.getsockname()[1], world_size, is_master=True,
                              timeout=datetime.timedelta(seconds=timeout), wait_for_workers=False,
                              master_listen_fd=sock.fileno(), **older)
    except BaseException:
        sock.close()
        raise
    sock.detach()  # the store's server owns the socket now and closes it
    return store


def start_children(world_size: int, timeout: float, output: str, command: list[str]) -> tuple[Launcher, Any]:
    """Host the rendezvous store, start ranks 1..N-1 with torchrun's variables; return the launcher and store.

    Also points this process's gloo and NCCL at the loopback interface, as the children's.
    """
    store = loopback_store(world_size, timeout)
    local = loopback_env()
    os.environ.update(local)
    launcher = Launcher(world_size, timeout, output, command, timeout_option=TIMEOUT_OPTION,
                        drop_env=("TORCHELASTIC_",))

    def child_env(rank: int) -> dict[str, str]:
        return {**local_launch_env(rank, world_size, store.port), **local, "GROUP_RANK": "0", "ROLE_RANK": str(rank)}

    launcher.start(store, child_env)
    return launcher, store
