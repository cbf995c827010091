"""What the pages show the ``drivetrain`` command printing is what it prints.

Every ```` ```console ```` block of docs/ is read as ``$ command`` lines, each followed by its
output. The ``drivetrain backends`` commands (and ``drivetrain --version``) need no files, so they
are run here, in the docs environment, and their output compared with the page's (``...`` stands
for any text, whitespace runs compare equal: see ``expected_output``). Other commands are shown
only (they need a checkpoint or a run record the page made earlier).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

import pytest

from .test_examples import DOCS, ROOT, code_blocks, doc_pages, expected_output

RUN = ("drivetrain backends", "drivetrain --version")


def console_commands() -> list[tuple[str, str, str]]:
    """``(page:line, command, shown output)`` of every runnable ``drivetrain`` command in a console block."""
    found = []
    for page in doc_pages():
        for block in code_blocks(page.read_text(encoding="utf-8")):
            if block.info != "console":
                continue
            lines = block.code.rstrip("\n").split("\n")
            starts = [i for i, line in enumerate(lines) if line.startswith("$ ")]
            for k, start in enumerate(starts):
                command = lines[start][2:].split("  #")[0].strip()
                if command.startswith(RUN):
                    end = starts[k + 1] if k + 1 < len(starts) else len(lines)
                    where = f"{page.relative_to(ROOT).as_posix()}:{block.line + start}"
                    found.append((where, command, "\n".join(lines[start + 1:end])))
    return found


COMMANDS = console_commands()


def test_the_pages_show_drivetrain_commands() -> None:
    shown = {command for _, command, _ in COMMANDS}
    assert {"drivetrain backends", "drivetrain backends --check torch"} <= shown, shown


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("where", "command", "shown"), COMMANDS, ids=[w for w, _, _ in COMMANDS])
def test_console_output_is_what_the_command_prints(where: str, command: str, shown: str) -> None:
    argv = [sys.executable, "-m", "drivetrain", *shlex.split(command)[1:]]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOG_minloglevel": "2"}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=240, cwd=DOCS, env=env)
    printed = done.stdout + done.stderr
    assert expected_output(shown, printed), f"{where}: `{command}` printed\n{printed}\nbut the page shows\n{shown}"
