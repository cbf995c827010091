"""``import paddle`` puts a handler on the root logger; drivetrain's own lines keep their format beside it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import logging
    import warnings

    warnings.simplefilter("ignore")
    import paddle  # the usual order: the framework first

    from drivetrain import Trainer

    assert logging.getLogger().handlers, "paddle no longer configures the root logger: this test is moot"
    model = paddle.nn.Linear(2, 1)
    Trainer(model, [{"x": paddle.ones([2, 2])}], paddle.optimizer.SGD(parameters=model.parameters()),
            driver="paddle", device="cpu", progress_bar=None)
    logging.getLogger("drivetrain").info("probe from drivetrain")
    logging.getLogger("drivetrain.plugins").warning("probe from a child logger")
    logging.getLogger("someone.else").warning("probe from another library")
""")


def _run(script: str) -> str:
    env = dict(os.environ, GLOG_minloglevel="2", OMP_NUM_THREADS="1")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    return result.stderr


def test_drivetrain_lines_keep_their_format_after_import_paddle() -> None:
    lines = _run(SCRIPT).splitlines()
    assert "drivetrain: probe from drivetrain" in lines
    assert "drivetrain: probe from a child logger" in lines
    assert not any("probe from drivetrain" in line and "INFO]" in line for line in lines)  # not paddle's format
    assert sum("probe from a child logger" in line for line in lines) == 1  # once: not also through the root
    # paddle's handler still serves everyone else, as paddle set it up
    assert any(line.endswith("probe from another library") and "WARNING]" in line for line in lines)


def test_an_application_that_configures_logging_still_gets_drivetrain_lines_in_its_format() -> None:
    script = SCRIPT.replace("import paddle  # the usual order: the framework first",
                            "import paddle\nlogging.getLogger().handlers.clear()\n"
                            "logging.basicConfig(format='APP %(name)s %(message)s', level=logging.INFO)")
    lines = _run(script).splitlines()
    assert "APP drivetrain probe from drivetrain" in lines
    assert "drivetrain: probe from drivetrain" not in lines
