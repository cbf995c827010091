"""DefaultSampling over a tiny framework-free DataLoader family (the shape torch, paddle and oneflow share)."""

from __future__ import annotations

from typing import Any

import pytest

from drivetrain.backend import DefaultSampling, ReproducibleBatchSampler, UnrepeatedBatchSampler


class Dataset:
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


class Stream:
    def __iter__(self) -> Any:
        return iter(range(3))


class SequentialSampler:
    def __init__(self, data_source: Any) -> None:
        self.data_source = data_source

    def __len__(self) -> int:
        return len(self.data_source)


class RandomSampler(SequentialSampler):
    def __init__(self, data_source: Any, replacement: bool = False, num_samples: int | None = None) -> None:
        super().__init__(data_source)
        self.replacement, self.num_samples = replacement, num_samples

    def __len__(self) -> int:
        return self.num_samples if self.num_samples is not None else len(self.data_source)


class WeightedSampler(SequentialSampler):
    pass


class BatchSampler:
    def __init__(self, sampler: Any, batch_size: int, drop_last: bool) -> None:
        self.sampler, self.batch_size, self.drop_last = sampler, batch_size, drop_last


class MyBatchSampler(BatchSampler):
    pass


class Generator:
    def __init__(self) -> None:
        self.seeds: list[int] = []

    def manual_seed(self, seed: int) -> None:
        self.seeds.append(seed)


class Loader:
    def __init__(self, dataset: Any, batch_size: int | None = 1, shuffle: bool = False, drop_last: bool = False,
                 sampler: Any = None, batch_sampler: Any = None, num_workers: int = 0, generator: Any = None,
                 collate_fn: Any = None) -> None:
        self.dataset, self.num_workers, self.generator, self.collate_fn = dataset, num_workers, generator, collate_fn
        if batch_sampler is None and batch_size is not None and not isinstance(dataset, Stream):
            sampler = sampler or (RandomSampler(dataset) if shuffle else SequentialSampler(dataset))
            batch_sampler = BatchSampler(sampler, batch_size, drop_last)
        self.batch_sampler = batch_sampler

    def __iter__(self) -> Any:
        for indices in self.batch_sampler:
            yield [self.dataset[i] for i in indices]


class SubLoader(Loader):
    pass


def _sampling(**changes: Any) -> DefaultSampling:
    options: dict[str, Any] = dict(
        loader_name="a fake DataLoader", loader_type=Loader, iterable_dataset=Stream, batch_sampler_type=BatchSampler,
        sequential_sampler=SequentialSampler, random_sampler=RandomSampler, draw_seed=lambda sampler, loader: 123,
        copied=("num_workers", "collate_fn"), settings=lambda loader: {},
    )
    return DefaultSampling(**{**options, **changes})


def _seeded(generator: Generator | None, seed: int) -> Generator:
    generator = Generator() if generator is None else generator
    generator.manual_seed(seed)
    return generator


def test_the_default_sampling_is_rebuilt_with_a_reproducible_sampler_and_the_same_settings() -> None:
    collate = object()
    loader = Loader(Dataset(10), batch_size=4, shuffle=True, drop_last=True, num_workers=2, collate_fn=collate)
    new = _sampling().reproducible(loader, agree_seed=lambda seed: seed + 1)
    assert type(new) is Loader and new is not loader and new.dataset is loader.dataset
    assert (new.num_workers, new.collate_fn) == (2, collate)
    sampler = new.batch_sampler
    assert isinstance(sampler, ReproducibleBatchSampler)
    assert (sampler.seed, sampler.batch_size, sampler.shuffle, sampler.drop_last) == (124, 4, True, True)
    assert len(list(new)) == 2 and not hasattr(new, "_drivetrain_owns_generator")


@pytest.mark.parametrize(("loader", "reason"), [
    ([1, 2], "it is a builtins.list, not a fake DataLoader"),
    (SubLoader(Dataset(4)), "it is a DataLoader subclass (SubLoader), which may need other arguments"),
    (Loader(Stream()), "its dataset is an IterableDataset, which has no indices to share out"),
    (Loader(Dataset(4), batch_size=None), "it was built with batch_size=None (no batching)"),
    (Loader(Dataset(4), batch_sampler=MyBatchSampler(SequentialSampler(Dataset(4)), 2, False)),
     "it uses its own batch_sampler (MyBatchSampler)"),
    (Loader(Dataset(4), sampler=WeightedSampler(Dataset(4))), "it uses its own sampler (WeightedSampler)"),
    (Loader(Dataset(4), sampler=RandomSampler(Dataset(4), replacement=True)), "its sampler draws with replacement"),
    (Loader(Dataset(4), sampler=RandomSampler(Dataset(4), num_samples=2)), "covers only part of the dataset"),
    (Loader(Dataset(4), sampler=SequentialSampler(Dataset(4))), "covers only part of the dataset"),  # another dataset
])
def test_other_sampling_is_left_alone_and_described(loader: Any, reason: str) -> None:
    sampling = _sampling()
    assert sampling.reproducible(loader) is loader
    assert sampling.unrepeated(loader, num_replicas=2, rank=0) is None
    assert reason in sampling.describe(loader)


def test_accepts_adds_the_framework_conditions_and_partial_reason_words_them() -> None:
    sampling = _sampling(accepts=lambda sampler, batch_sampler: batch_sampler.batch_size < 3, partial_reason="why")
    small, large = Loader(Dataset(6), batch_size=2), Loader(Dataset(6), batch_size=3)
    assert isinstance(sampling.reproducible(small).batch_sampler, ReproducibleBatchSampler)
    assert sampling.reproducible(large) is large and sampling.describe(large) == "why"


def test_evaluation_shards_read_each_kept_sample_once() -> None:
    loader = Loader(Dataset(11), batch_size=2, shuffle=True, drop_last=True)
    shards = [_sampling().unrepeated(loader, num_replicas=2, rank=rank) for rank in (0, 1)]
    assert all(isinstance(shard.batch_sampler, UnrepeatedBatchSampler) for shard in shards)
    read = [i for shard in shards for batch in shard for i in batch]
    assert sorted(read) == list(range(10))


def test_a_generator_made_here_is_seeded_per_epoch_and_rank_and_a_users_is_kept() -> None:
    sampling = _sampling(seed_generator=_seeded, users_generator=lambda loader: loader.generator)
    new = sampling.reproducible(Loader(Dataset(8), batch_size=2, shuffle=True), num_replicas=2, rank=1)
    made = new.generator
    assert isinstance(made, Generator) and len(made.seeds) == 1
    sampling.reseed_for_epoch(new, 0)
    sampling.reseed_for_epoch(new, 3)
    assert made.seeds[1] == made.seeds[0] and made.seeds[2] != made.seeds[0] and made.seeds[2] < 2**64
    other_rank = sampling.reproducible(Loader(Dataset(8), batch_size=2, shuffle=True), num_replicas=2, rank=0)
    assert other_rank.generator.seeds != made.seeds[:1]

    mine = Generator()
    kept = sampling.reproducible(Loader(Dataset(8), batch_size=2, generator=mine))
    sampling.reseed_for_epoch(kept, 2)
    assert kept.generator is mine and mine.seeds == []
    shard = sampling.unrepeated(Loader(Dataset(8), batch_size=2, generator=mine), num_replicas=2, rank=0)
    assert shard.generator is mine
