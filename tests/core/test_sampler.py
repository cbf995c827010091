"""The samplers behind exact resume and distributed data splitting."""

from __future__ import annotations

import pytest

from drivetrain import ConfigurationError, ReproducibleBatchSampler
from drivetrain._data.sampler import UnrepeatedBatchSampler


def flat(batches):
    return [i for b in batches for i in b]


def test_same_seed_same_order_new_epoch_new_order():
    a = ReproducibleBatchSampler(50, 4, shuffle=True, seed=3)
    b = ReproducibleBatchSampler(50, 4, shuffle=True, seed=3)
    assert list(a) == list(b)
    first = flat(a)
    a.set_epoch(1)
    second = flat(a)
    assert sorted(first) == sorted(second) == list(range(50)) and first != second


def test_resume_yields_exactly_the_tail_without_reading_the_head():
    s = ReproducibleBatchSampler(100_000, 1, shuffle=True, seed=1)
    full = s.order()
    s.resume(0, 99_990)
    tail = list(s)
    assert flat(tail) == full[99_990:].tolist()
    assert len(s) == 100_000 and len(tail) == 10


@pytest.mark.parametrize("drop_last", [False, True])
def test_two_ranks_see_the_samples_of_one_process_with_the_global_batch(drop_last):
    single = list(ReproducibleBatchSampler(40, 8, shuffle=True, seed=5, drop_last=drop_last))
    ranks = [list(ReproducibleBatchSampler(40, 4, shuffle=True, seed=5, num_replicas=2, rank=r,
                                           drop_last=drop_last)) for r in (0, 1)]
    assert len(ranks[0]) == len(ranks[1]) == len(single)
    for step, batch in enumerate(single):
        assert ranks[0][step] + ranks[1][step] == batch


def test_uneven_last_global_batch_is_padded_so_ranks_stay_in_step():
    ranks = [list(ReproducibleBatchSampler(10, 4, shuffle=False, num_replicas=2, rank=r)) for r in (0, 1)]
    assert [len(b) for b in ranks[0]] == [len(b) for b in ranks[1]] == [4, 1]
    assert set(flat(ranks[0]) + flat(ranks[1])) == set(range(10))


def test_even_batches_refuses_a_size_that_needs_padding():
    with pytest.raises(ConfigurationError, match="not a multiple of batch_size 4 x 2 processes"):
        ReproducibleBatchSampler(10, 4, shuffle=False, num_replicas=2, rank=0, even_batches=True)


@pytest.mark.parametrize(("old", "new"), [(2, 1), (1, 2), (2, 3)])
def test_resume_with_another_world_size_sees_each_remaining_sample_once(old, new):
    n, bs = 48, 4
    before = [ReproducibleBatchSampler(n, bs, shuffle=True, seed=2, num_replicas=old, rank=r) for r in range(old)]
    iters = [iter(s) for s in before]
    seen = []
    for _ in range(3):  # three steps on every rank
        for it in iters:
            seen += next(it)
    consumed = before[0].consumed_samples(3)
    assert consumed == 3 * bs * old
    after = [ReproducibleBatchSampler(n, bs, shuffle=True, seed=2, num_replicas=new, rank=r) for r in range(new)]
    rest = []
    for s in after:
        s.resume(0, consumed)
        rest += flat(s)
    assert sorted(seen + rest) == list(range(n))


def test_unrepeated_sampler_splits_without_duplicates():
    shards = [flat(UnrepeatedBatchSampler(11, 2, num_replicas=3, rank=r)) for r in range(3)]
    assert sorted(shards[0] + shards[1] + shards[2]) == list(range(11))
    assert [len(s) for s in shards] == [4, 4, 3]


@pytest.mark.parametrize("kwargs", [dict(batch_size=0), dict(rank=2, num_replicas=2), dict(dataset_len=-1)])
def test_bad_layouts_are_named(kwargs):
    args = dict(dataset_len=10, batch_size=2, shuffle=False) | kwargs
    with pytest.raises(ConfigurationError, match=next(iter(kwargs))):
        ReproducibleBatchSampler(**args)
