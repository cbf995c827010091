"""The resume rule at any world size, as a property: real Trainers on the numpy driver, one per simulated rank.

Each rank of a simulated world is its own Trainer whose driver reports that rank and world size and
reads its share of every global batch (``ReproducibleBatchSampler(num_replicas=W, rank=r)``), which is
all a data-parallel driver does to the data. Rank 0 writes a checkpoint at some position (inside an
epoch, at an epoch's end, at the run's end); then every rank of another world size resumes from it.
Over all of them, each epoch must see every sample once (a padded or dropped tail aside), the run must
train exactly the epochs ``n_epochs`` asks for, and its step count must be what the plan says.
"""

from __future__ import annotations

import collections
import os
import tempfile
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from drivetrain import Callback, CallbackError, ReproducibleBatchSampler, Trainer
from drivetrain_numpy import SGD, ArrayLoader, LinearModel
from drivetrain_numpy.driver import NumpyDriver

from .conftest import make_regression


class SimulatedRankDriver(NumpyDriver):
    """The numpy driver as rank ``rank`` of ``world`` processes, as far as the data goes (no collectives)."""

    def __init__(self, model: Any, *, rank: int, world: int) -> None:
        super().__init__(model)
        self._rank, self._world = rank, world

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._world

    def set_dist_repro_dataloader(self, dataloader: Any, *, dist: str | None, reproducible: bool) -> Any:
        sampler = ReproducibleBatchSampler(dataloader.n, dataloader.batch_size, shuffle=dataloader.shuffle,
                                           drop_last=dataloader.drop_last, seed=dataloader.seed,
                                           num_replicas=self._world, rank=self._rank)
        return ArrayLoader(dataloader.arrays, batch_size=dataloader.batch_size, batch_sampler=sampler)


class SeenSamples(Callback):
    """Which dataset indices each epoch's batches held on this rank."""

    def __init__(self, seen: dict[int, list[int]]) -> None:
        self.seen = seen

    def on_train_batch_begin(self, trainer, batch, indices) -> None:
        self.seen[trainer.cur_epoch_idx].extend(indices)


class Stop(Exception):
    pass


def build(rank: int, world: int, *, n: int, batch: int, shuffle: bool, drop_last: bool, n_epochs: int,
          seen: dict[int, list[int]], callbacks: list | None = None) -> Trainer:
    model = LinearModel(3, 1, seed=0)
    data = ArrayLoader(make_regression(n=n), batch_size=batch, shuffle=shuffle, seed=7, drop_last=drop_last)
    return Trainer(model, data, SGD(model.params, model.grads, lr=0.01),
                   driver=SimulatedRankDriver(model, rank=rank, world=world), n_epochs=n_epochs,
                   callbacks=[SeenSamples(seen), *(callbacks or [])], progress_bar=None)


class SaveAt(Callback):
    """Rank 0 saves at global step ``step`` (0: never mid-run); every rank stops there."""

    def __init__(self, step: int, folder: str, at_epoch_end: bool) -> None:
        self.step, self.folder, self.at_epoch_end = step, folder, at_epoch_end

    def on_train_batch_end(self, trainer) -> None:
        if not self.at_epoch_end and trainer.global_forward_batches == self.step:
            self._save_and_stop(trainer)

    def on_train_epoch_end(self, trainer) -> None:
        if self.at_epoch_end and trainer.global_forward_batches == self.step:
            self._save_and_stop(trainer)

    def _save_and_stop(self, trainer) -> None:
        if trainer.driver.is_global_zero:
            trainer.save_checkpoint(self.folder)
        raise Stop


def run_until(world: int, step: int, at_epoch_end: bool, folder: str, seen: dict, **data: Any) -> None:
    for rank in range(world):
        trainer = build(rank, world, seen=seen, callbacks=[SaveAt(step, folder, at_epoch_end)], **data)
        try:
            trainer.run(num_eval_sanity_batch=0)
        except CallbackError as exc:
            assert isinstance(exc.__cause__, Stop), exc
            continue
        if rank == 0:  # the run ended before `step`: its end is the checkpoint
            trainer.save_checkpoint(folder)


def batches_per_epoch(n: int, batch: int, world: int, drop_last: bool) -> int:
    full, rest = divmod(n, batch * world)
    return full if drop_last or not rest else full + 1


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 40), batch=st.integers(1, 5), before=st.integers(1, 4), after=st.integers(1, 4),
       shuffle=st.booleans(), drop_last=st.booleans(), n_epochs=st.integers(1, 3), extra_epochs=st.integers(0, 2),
       where=st.sampled_from(["mid-epoch", "epoch end", "run end"]), fraction=st.floats(0, 1))
def test_a_resume_at_any_world_size_trains_every_remaining_sample_of_every_epoch_once(
        n, batch, before, after, shuffle, drop_last, n_epochs, extra_epochs, where, fraction):
    data = dict(n=n, batch=batch, shuffle=shuffle, drop_last=drop_last)
    per_before, per_after = (batches_per_epoch(n, batch, world, drop_last) for world in (before, after))
    if not (per_before and per_after):
        return  # drop_last with fewer samples than one global batch: nothing trains at all
    total = per_before * n_epochs
    if where == "run end":
        step, at_epoch_end = total, True
    elif where == "epoch end":
        step, at_epoch_end = per_before * min(n_epochs, 1 + int(fraction * n_epochs)), True
    else:
        epoch = min(n_epochs - 1, int(fraction * n_epochs))
        step, at_epoch_end = epoch * per_before + 1 + int(fraction * (per_before - 1)), False
    seen: dict[int, list[int]] = collections.defaultdict(list)
    with tempfile.TemporaryDirectory() as tmp:
        folder = os.path.join(tmp, "ckpt")
        run_until(before, step, at_epoch_end, folder, seen, n_epochs=n_epochs, **data)
        resumed_epochs = n_epochs + extra_epochs
        steps = set()
        for rank in range(after):
            trainer = build(rank, after, seen=seen, n_epochs=resumed_epochs, **data)
            trainer.run(resume_from=folder, num_eval_sanity_batch=0)
            steps.add((trainer.global_forward_batches, trainer.n_batches))

    # every epoch asked for was trained, none more
    assert sorted(seen) == list(range(resumed_epochs))
    for epoch, indices in seen.items():
        counts = collections.Counter(indices)
        # no sample twice, but for a padded last global batch (fewer than `world` samples taken again)
        repeats = sum(c - 1 for c in counts.values())
        assert repeats < max(before, after), (epoch, counts)
        # every sample seen, but for a tail that drop_last drops (shorter than a global batch)
        missing = n - len(counts)
        assert 0 <= missing < (batch * max(before, after) if drop_last else 1), (epoch, missing)
    # every rank ends at the same step, the planned one: the steps before plus the remaining batches of this layout
    ((final, planned),) = steps
    assert final == planned
    if where != "mid-epoch":
        assert final == step + (resumed_epochs - step // per_before) * per_after


def test_two_ranks_to_three_trains_the_third_epoch():
    """The reported case: 2 epochs at 2 ranks, resumed at 3 with n_epochs=3, ended at once, training nothing
    (the 46 steps of 2 ranks were compared with 3 epochs of 15 steps)."""
    data = dict(n=1437, batch=32, shuffle=True, drop_last=False)
    seen: dict[int, list[int]] = collections.defaultdict(list)
    with tempfile.TemporaryDirectory() as tmp:
        folder = os.path.join(tmp, "ckpt")
        run_until(2, 46, True, folder, seen, n_epochs=2, **data)
        assert sorted(seen) == [0, 1]
        for rank in range(3):
            trainer = build(rank, 3, seen=seen, n_epochs=3, **data)
            trainer.run(resume_from=folder, num_eval_sanity_batch=0)
            assert (trainer.global_forward_batches, trainer.cur_epoch_idx) == (46 + 15, 3)
    assert sorted(set(seen[2])) == list(range(1437))


def test_a_run_ended_by_n_batches_inside_an_epoch_resumes_inside_it():
    """n_batches reached mid-epoch: the epoch stays open, so its checkpoint resumes at that batch and a longer
    run trains the rest of the epoch (it was counted as complete, and its remaining samples skipped)."""
    seen: dict[int, list[int]] = collections.defaultdict(list)
    model = LinearModel(3, 1, seed=0)
    data = ArrayLoader(make_regression(n=40), batch_size=4, shuffle=True, seed=3)
    first = Trainer(model, data, SGD(model.params, model.grads, lr=0.01), driver="numpy", n_batches=14,
                    callbacks=[SeenSamples(seen)], progress_bar=None)
    first.run(num_eval_sanity_batch=0)
    assert (first.cur_epoch_idx, first.batch_idx_in_epoch) == (1, 4)
    with tempfile.TemporaryDirectory() as tmp:
        first.save_checkpoint(os.path.join(tmp, "end"))
        second = Trainer(model, data, SGD(model.params, model.grads, lr=0.01), driver="numpy", n_batches=20,
                         callbacks=[SeenSamples(seen)], progress_bar=None)
        second.run(resume_from=os.path.join(tmp, "end"), num_eval_sanity_batch=0)
    assert second.global_forward_batches == 20 and second.cur_epoch_idx == 2
    assert sorted(seen[1]) == list(range(40)) and len(seen[0]) == 40
    assert np.all(np.isfinite(model.params["weight"]))
