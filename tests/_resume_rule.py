"""The resume rule at another world size with real processes: the phases every backend's script runs, and
the tests every backend's ``test_resume_world_sizes.py`` runs on them (:class:`ResumeAtAnotherWorldSize`).
Framework-free (drivetrain's core only).

It lives here, beside the paddle test, only because the backends' test folders are where these tests may
add files; the oneflow and jittor tests import it from here (nothing in it imports paddle).

The rule (docs/user-guide/checkpoints.md, "The resume rule: another world size, a finished run"): a
checkpoint records the epoch, the samples consumed and the steps taken; a run resumed at another world
size re-derives its batch position in its own layout, ``n_epochs`` counts epochs, and a resumed run with
nothing left trains nothing and says so. A backend's script gives :func:`main` a
``make_trainer(n_epochs, callbacks)`` that builds the same small run on every rank (``PER_RANK``
samples per rank and step, ``N_SAMPLES`` samples, shuffled); the phases, one ``Trainer.run`` each:

- ``first``: ``FIRST_EPOCHS`` epochs with ``CheckpointCallback(OUT/ckpt, every_n_epochs=1)``;
- ``finished``: the same callback and ``n_epochs``, resumed from ``OUT/ckpt/last``: nothing to train;
- ``more``: the same callback, ``n_epochs=MORE_EPOCHS``, resumed from the periodic checkpoint of the
  last epoch ``first`` trained (``OUT/ckpt/step_*-epoch_2-batch_0``): one more epoch;
- ``ended``: the same callback and ``n_epochs`` as ``more``, resumed from ``more``'s ``last``: nothing.

Each rank writes ``OUT/<phase>-rank<r>.json``: its world size, the dataset indices of every batch per
epoch (the ``indices`` of ``on_train_batch_begin``, checked against the batch's own index field), the
events that fired, the final step and epoch, the drivetrain log lines, and the checkpoint folder's
manifests (name -> mtime) before and after the run.
"""

from __future__ import annotations

import glob
import json
import logging
import os
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from drivetrain import Callback, CheckpointCallback, Trainer

N_SAMPLES, PER_RANK = 50, 4
FIRST_EPOCHS, MORE_EPOCHS = 2, 3
CKPT = "ckpt"
NOTHING = "nothing to train"


def batches_per_epoch(world: int, per_rank: int = PER_RANK) -> int:
    """Steps of one epoch at ``world`` ranks (the last global batch padded, never dropped)."""
    return -(-N_SAMPLES // (per_rank * world))


class Seen(Callback):
    """The dataset indices this rank trained on, per epoch, and which run events fired."""

    def __init__(self, index_key: str) -> None:
        self.index_key = index_key
        self.seen: dict[str, list[int]] = {}
        self.mismatch: list[tuple[list[int], list[int]]] = []  # batches whose indices named other samples
        self.events: Counter = Counter()

    def on_train_begin(self, trainer) -> None:
        self.events["on_train_begin"] += 1

    def on_train_epoch_begin(self, trainer) -> None:
        self.events["on_train_epoch_begin"] += 1

    def on_train_batch_begin(self, trainer, batch, indices) -> None:
        mine = [int(i) for i in indices]
        self.seen.setdefault(str(trainer.cur_epoch_idx), []).extend(mine)
        carried = [int(i) for i in trainer.driver.tensor_to_numpy(batch[self.index_key]).ravel()]
        if carried != mine:
            self.mismatch.append((mine, carried))

    def on_train_end(self, trainer) -> None:
        self.events["on_train_end"] += 1


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def manifests(folder: str) -> dict[str, int]:
    """Each checkpoint in ``folder`` and its manifest's mtime (ns)."""
    found = glob.glob(os.path.join(folder, "*", "manifest.json"))
    return {os.path.basename(os.path.dirname(path)): os.stat(path).st_mtime_ns for path in found}


def run_phase(phase: str, out: str, make_trainer: Callable[[int, list], Trainer], index_key: str) -> None:
    folder = os.path.join(out, CKPT)
    resume_from = None
    if phase in ("finished", "ended"):
        resume_from = os.path.join(folder, "last")
    elif phase == "more":
        (resume_from,) = glob.glob(os.path.join(folder, f"step_*-epoch_{FIRST_EPOCHS}-batch_0"))
    seen = Seen(index_key)
    n_epochs = FIRST_EPOCHS if phase in ("first", "finished") else MORE_EPOCHS
    trainer = make_trainer(n_epochs, [seen, CheckpointCallback(folder, every_n_epochs=1)])
    lines = Lines()
    logger = logging.getLogger("drivetrain")
    logger.addHandler(lines)  # after the Trainer set the logger up, so that its own output handler stays
    before = manifests(folder)
    try:
        trainer.run(resume_from=resume_from)
    finally:
        logger.removeHandler(lines)
    driver = trainer.driver
    record = {"rank": driver.rank, "world_size": driver.world_size, "seen": seen.seen, "mismatch": seen.mismatch,
              "events": dict(seen.events), "step": trainer.global_forward_batches, "epoch": trainer.cur_epoch_idx,
              "log": lines.lines, "before": before, "after": manifests(folder)}
    with open(os.path.join(out, f"{phase}-rank{driver.rank}.json"), "w") as f:
        json.dump(record, f)


def main(argv: list[str], make_trainer: Callable[[int, list], Trainer], index_key: str) -> None:
    """``argv``: OUT and the phases to run one after the other, comma-separated (also ``_ctrl_c_rule.py``'s)."""
    out, phases = argv
    for phase in phases.split(","):
        if phase in ("ctrl-c", "resume", "straight"):  # tests/_ctrl_c_rule.py's
            from tests._ctrl_c_rule import run_phase as ctrl_c_phase

            ctrl_c_phase(phase, out, make_trainer)
        else:
            run_phase(phase, out, make_trainer, index_key)


# ------------------------------------------------------------------------------ checks (test side)
# (plain asserts with messages: pytest rewrites only the test modules' own asserts)
def read(out: os.PathLike, phase: str, world: int) -> list[dict[str, Any]]:
    records = []
    for rank in range(world):
        with open(os.path.join(out, f"{phase}-rank{rank}.json")) as f:
            records.append(json.load(f))
    layout = [(r["rank"], r["world_size"]) for r in records]
    assert layout == [(rank, world) for rank in range(world)], f"{phase}: (rank, world size) {layout}"
    return records


def _summary(phase: str, record: dict[str, Any]) -> str:
    seen = {epoch: len(indices) for epoch, indices in record["seen"].items()}
    return (f"{phase} rank {record['rank']}/{record['world_size']}: step {record['step']}, epoch {record['epoch']}, "
            f"samples per epoch {seen}, events {record['events']}, mismatched batches {record['mismatch'][:2]}, "
            f"log {record['log']}")


def check_first(out: os.PathLike, world: int, per_rank: int = PER_RANK) -> int:
    """The first run trained ``FIRST_EPOCHS`` whole epochs; returns its final step."""
    steps = FIRST_EPOCHS * batches_per_epoch(world, per_rank)
    for record in read(out, "first", world):
        ok = (record["step"], record["epoch"], sorted(record["seen"])) == (
            steps, FIRST_EPOCHS, [str(e) for e in range(FIRST_EPOCHS)])
        assert ok and not record["mismatch"], _summary("first", record)
    saved = sorted(manifests(os.path.join(out, CKPT)))
    per_epoch = steps // FIRST_EPOCHS
    assert saved == ["last", *(f"step_{e * per_epoch:08d}-epoch_{e}-batch_0" for e in range(1, FIRST_EPOCHS + 1))], \
        saved
    return steps


def check_one_more_epoch(out: os.PathLike, world: int, steps_before: int, per_rank: int = PER_RANK) -> None:
    """``more`` at ``world`` ranks trained exactly the epoch after ``first``'s: over the ranks each sample
    once (but for fewer than ``world`` taken again to pad the last global batch), ending at the step
    ``first`` ended at plus one epoch of batches in this layout."""
    per_epoch = batches_per_epoch(world, per_rank)
    records = read(out, "more", world)
    indices: list[int] = []
    for record in records:
        # the third epoch only, none before or after, in one epoch of this layout's steps
        ok = (sorted(record["seen"]), record["step"], record["epoch"], record["events"]) == (
            [str(FIRST_EPOCHS)], steps_before + per_epoch, MORE_EPOCHS,
            {"on_train_begin": 1, "on_train_epoch_begin": 1, "on_train_end": 1})
        assert ok and not record["mismatch"], _summary("more", record)
        indices += record["seen"][str(FIRST_EPOCHS)]
    counts = Counter(indices)
    again = {i: c for i, c in counts.items() if c > 1}
    missing = sorted(set(range(N_SAMPLES)) - set(counts))
    assert not missing and sum(c - 1 for c in again.values()) < world, f"missing {missing}, repeated {again}"
    # the resumed run's own checkpoint: after its epoch, at its step
    assert f"step_{steps_before + per_epoch:08d}-epoch_{MORE_EPOCHS}-batch_0" in records[0]["after"], records[0]


def check_nothing_trained(out: os.PathLike, world: int, steps_before: int, rank_zero_output: str | None,
                          phase: str = "finished") -> None:
    """``finished`` (or ``ended``) at ``world`` ranks: the final checkpoint with the same ``n_epochs`` trained
    nothing, fired no event, rewrote no checkpoint (``last`` included), and rank 0 said so in one line
    (``rank_zero_output``: what rank 0 printed, where the test can read it)."""
    epochs = FIRST_EPOCHS if phase == "finished" else MORE_EPOCHS
    records = read(out, phase, world)
    for record in records:
        ok = (record["seen"], record["events"], record["step"], record["epoch"]) == ({}, {}, steps_before, epochs)
        assert ok, _summary(phase, record)
        assert record["before"] == record["after"] and "last" in record["before"], \
            f"{phase} rank {record['rank']}: checkpoints (mtime) before {record['before']}, after {record['after']}"
    said = [line for line in records[0]["log"] if NOTHING in line]
    assert len(said) == 1, records[0]["log"]
    assert f"n_epochs={epochs} asks for no more" in said[0] and f"n_epochs={epochs + 1}" in said[0], said
    if rank_zero_output is not None:
        assert NOTHING in rank_zero_output, rank_zero_output[-3000:]


# ------------------------------------------------------------------------------- the tests
def finish(group: Any, timeout: float, label: str, logs: Callable[[], str] = str) -> str:
    """Wait for a launched group (a ``_dist_helpers.ProcessGroup`` or alike), kill whatever is left of it,
    require exit status 0 (``logs``: the workers' logs to show otherwise); its output."""
    try:
        done = group.wait(timeout)
    finally:
        group.close()
    assert done.returncode == 0, done.output[-3000:] + logs()[-5000:]
    print(f"\n{label}: {done.seconds:.1f} s")
    return done.output


class Resumed(NamedTuple):
    out: Path
    steps: int  # where the 2-rank run ended
    output: str  # what rank 0 printed in the 3-rank launch (alone or among the others)


def launch_both(out: Path, launch: Callable[[Path, int, str], str], per_rank: int = PER_RANK) -> Resumed:
    """``first`` at 2 ranks, then ``finished`` and ``more`` at 3: ``launch(out, world, phases)`` runs a
    launch to its end and returns rank 0's output."""
    launch(out, 2, "first")
    steps = check_first(out, 2, per_rank)
    return Resumed(out, steps, launch(out, 3, "finished,more"))


class ResumeAtAnotherWorldSize:
    """The tests a backend's module runs by subclassing this as ``Test...`` and giving it a module fixture
    ``resumed`` (:func:`launch_both` with its launcher), its script module (``make_trainer``), the batch's
    index field and the samples per rank and step.

    - epoch boundary: 2 ranks' checkpoint of epoch 2 resumed at 3 with ``n_epochs=3`` trains the third
      epoch once over the 3 ranks, in one epoch of the 3-rank layout;
    - end of run: 2 ranks' ``last`` resumed at 3 with the same ``n_epochs`` trains nothing, rewrites no
      checkpoint, and rank 0 says "nothing to train";
    - and back: the 3-rank run's own ``last`` (epoch 3) resumed in the test's one process with
      ``n_epochs=3`` trains nothing either.
    """

    script: Any
    index_key: str
    per_rank: int = PER_RANK

    def test_two_ranks_resumed_at_three_train_exactly_the_third_epoch(self, resumed: Resumed) -> None:
        check_one_more_epoch(resumed.out, 3, resumed.steps, self.per_rank)

    def test_the_final_checkpoint_at_another_world_size_trains_nothing(self, resumed: Resumed) -> None:
        check_nothing_trained(resumed.out, 3, resumed.steps, resumed.output)

    def test_the_three_rank_end_resumed_in_one_process_trains_nothing(self, resumed: Resumed) -> None:
        run_phase("ended", str(resumed.out), self.script.make_trainer, self.index_key)
        ended_at = resumed.steps + batches_per_epoch(3, self.per_rank)
        check_nothing_trained(resumed.out, 1, ended_at, None, phase="ended")
