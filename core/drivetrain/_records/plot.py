"""``drivetrain plot RUN_DIR ... [-o PATH]``: the curves of one or several run records.

A run folder holds ``metrics.jsonl`` or ``metrics.csv`` (written by the ``"jsonl"``/``"csv"``
loggers). One panel per quantity: the training loss, the learning rate(s), then every
evaluation metric, each against the global batch count; several runs are overlaid, one
colour per run, labelled by folder name. The picture goes beside the record (``RUN_DIR/curves.png``, the
first folder's when there are several) unless ``-o`` says where, never silently into the current folder.
Needs matplotlib (``pip install matplotlib``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

from .._common import ConfigurationError
from .files import read_csv_rows, read_jsonl_rows

DEFAULT_NAME = "curves.png"
"""The picture's file name in the run folder when ``-o`` is not given."""
INSTALL = 'pip install matplotlib (or, from a drivetrain checkout, pip install -e ".[plot]")'


def read_record(run_dir: str) -> list[dict[str, Any]]:
    """The rows of a run folder's record (``metrics.jsonl`` preferred, else ``metrics.csv``)."""
    jsonl, table = os.path.join(run_dir, "metrics.jsonl"), os.path.join(run_dir, "metrics.csv")
    if os.path.isfile(jsonl):
        return read_jsonl_rows(jsonl)
    if os.path.isfile(table):
        return read_csv_rows(table)
    raise ConfigurationError(
        f"{run_dir} holds no run record (metrics.jsonl or metrics.csv); pass the folder a Trainer with "
        "loggers=['jsonl'] or ['csv'] wrote (its run_dir, printed at the start of training)."
    )


def panels(records: Sequence[list[dict[str, Any]]]) -> list[str]:
    """The quantities to draw, in order: loss, learning rates, then evaluation metrics (sorted)."""
    names = {key for rows in records for row in rows for key in row if key not in ("step", "epoch")}
    loss = [n for n in ("train/loss",) if n in names]
    lrs = sorted(n for n in names if n.startswith("train/lr"))
    evals = sorted(n for n in names if n.startswith("eval/"))
    return loss + lrs + evals


def plot_runs(run_dirs: Sequence[str], output: str) -> str:
    """Draw the records of ``run_dirs`` into the image file ``output``; returns its absolute path."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigurationError(f"drivetrain plot needs matplotlib, which is not installed: {INSTALL}.") from None
    records = [read_record(run_dir) for run_dir in run_dirs]
    names = panels(records)
    if not names:
        raise ConfigurationError(f"the records of {list(run_dirs)} hold no loss, learning rate or evaluation metric.")
    columns = min(3, len(names))
    rows = math.ceil(len(names) / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(5 * columns, 3.4 * rows), squeeze=False)
    for ax, name in zip(axes.flat, names, strict=False):  # spare axes are hidden below
        for run_dir, record in zip(run_dirs, records, strict=True):
            points = [(row["step"], row[name]) for row in record if name in row]
            if points:
                steps = [step for step, _ in points]
                values = [value for _, value in points]
                ax.plot(steps, values, marker="o" if len(points) < 20 else None, markersize=3,
                        label=os.path.basename(os.path.normpath(run_dir)))
        ax.set_title(name)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if len(run_dirs) > 1:
            ax.legend(fontsize="small")
    for ax in list(axes.flat)[len(names):]:
        ax.set_visible(False)
    figure.tight_layout()
    figure.savefig(output, dpi=110)
    plt.close(figure)
    return os.path.abspath(output)
