"""Starting the other processes of a torch run from a plain ``python train.py``.

The machinery (re-running the command line, watching the children, naming the one
that failed) is the core's :mod:`drivetrain.backend` launcher; what is torch's own is
the rendezvous: a ``TCPStore`` on a free port hosted by this process (rank 0), and
the variables torchrun would set for each child.
"""

from __future__ import annotations

import datetime
from typing import Any

from drivetrain.backend import LOCALHOST, Launcher, local_launch_env, relaunch_command

TORCHRUN = "torchrun --nproc_per_node N train.py"
TIMEOUT_OPTION = "torch_kwargs['timeout']"


def torch_relaunch_command(**kwargs: Any) -> list[str]:
    """This program's command line, or a DriverError offering torchrun instead."""
    return relaunch_command(TORCHRUN, **kwargs)


def start_children(world_size: int, timeout: float, output: str, command: list[str]) -> tuple[Launcher, Any]:
    """Host the rendezvous store, start ranks 1..N-1 with torchrun's variables; return the launcher and store."""
    from torch import distributed as dist

    store = dist.TCPStore(LOCALHOST, 0, world_size, is_master=True,
                          timeout=datetime.timedelta(seconds=timeout), wait_for_workers=False)
    launcher = Launcher(world_size, timeout, output, command, timeout_option=TIMEOUT_OPTION,
                        drop_env=("TORCHELASTIC_",))

    def child_env(rank: int) -> dict[str, str]:
        return {**local_launch_env(rank, world_size, store.port), "GROUP_RANK": "0", "ROLE_RANK": str(rank)}

    launcher.start(store, child_env)
    return launcher, store


