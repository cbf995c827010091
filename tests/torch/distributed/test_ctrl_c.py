"""Ctrl-C and SIGTERM on a two-process torch run, started by the Trainer (``nproc=2``) or by torchrun.

A terminal's Ctrl-C sends SIGINT to every process of the run; a user or a tool may also signal the
process they started alone. Either way every rank stops within seconds, the exception checkpoint is
written, rank 0 closes the run record (``summary.json``: ``stopped``) without a collective, and the
script ends by the signal (status 130 / 143 in a shell) with one line instead of a traceback per
process; ``resume_from="latest"`` then ends where an uninterrupted run does. The phases and checks:
``tests/_ctrl_c_rule.py`` (the same for every backend); the run: ``_ddp_script.py ctrl-c``.
"""

from __future__ import annotations

import importlib.util
import signal
import sys
from pathlib import Path

import pytest

from ... import _ctrl_c_rule as rule
from ..._dist_helpers import ProcessGroup
from .conftest import child_env, spawn, torchrun

pytestmark = [pytest.mark.distributed, pytest.mark.torch]
SUITE_SECONDS = 54  # seconds, measured alone (tests/conftest.py splits the process tests into shards by it)

FSDP_SCRIPT = str(Path(__file__).with_name("_fsdp_script.py"))
DEEPSPEED_SCRIPT = str(Path(__file__).with_name("_deepspeed_script.py"))
HAS_DEEPSPEED = all(importlib.util.find_spec(name) is not None for name in ("deepspeed", "drivetrain_deepspeed"))
NEEDS_DEEPSPEED = pytest.mark.skipif(not HAS_DEEPSPEED, reason="needs deepspeed and backends/deepspeed")


def _case(launcher: str, target: str, signum: int, resume: bool, *marks: pytest.MarkDecorator) -> object:
    return pytest.param(launcher, target, signum, resume, marks=marks,
                        id=f"{launcher}-{target}-{signal.Signals(signum).name}")


CASES = [  # launcher, what gets the signal, the signal, resumed afterwards (once per engine: see rule.cases)
    _case("nproc", "group", signal.SIGINT, False),
    _case("nproc", "rank0", signal.SIGTERM, False),  # `kill PID`, `timeout`: SIGTERM to the process started
    _case("torchrun", "group", signal.SIGINT, True),
    _case("torchrun", "launcher", signal.SIGINT, False),
    _case("fsdp-torchrun", "group", signal.SIGINT, True),  # driver="torch_fsdp": sharded state, the same rule
    _case("fsdp-nproc", "rank0", signal.SIGINT, False),
    _case("deepspeed-torchrun", "group", signal.SIGINT, True, NEEDS_DEEPSPEED),  # ZeRO-3
]


def _command(launcher: str, out: Path, phases: str) -> list[str]:
    engine, _, start = launcher.rpartition("-")
    if engine:  # fsdp-..., deepspeed-...: that script, started by torchrun or by the Trainer (nproc)
        script = FSDP_SCRIPT if engine == "fsdp" else DEEPSPEED_SCRIPT
        return [*(torchrun()[:-1] if start == "torchrun" else [sys.executable]), script, str(out), phases]
    return (torchrun if launcher == "torchrun" else spawn)("ctrl-c", str(out), phases)


@pytest.mark.parametrize("launcher, target, signum, resume", CASES)
def test_a_stop_signal_ends_every_rank_with_the_records_closed_and_resume_is_exact(
        tmp_path: Path, launcher, target, signum, resume) -> None:
    launches = iter(range(2))

    def launch(phases: str) -> ProcessGroup:
        env = child_env()
        if launcher.endswith("nproc"):
            env[rule.NPROC_ENV] = "2"
        return ProcessGroup(_command(launcher, tmp_path, phases), tmp_path, env, f"launch-{next(launches)}",
                            interruptible=True)

    if launcher.endswith("nproc"):
        rule.interrupt_and_resume(launch, tmp_path, signum, target, resume=resume)
    else:  # torchrun passes the signal on to its workers, then ends with its own SignalException (status 1)
        rule.interrupt_and_resume(launch, tmp_path, signum, target, resume=resume, launcher_code=1,
                                  launcher_traceback="SignalException")
