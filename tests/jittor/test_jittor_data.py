"""jittor Datasets and plain iterables as training and evaluation data."""

from __future__ import annotations

import numpy as np
import pytest

from drivetrain import DriverError, Event, ReproducibleBatchSampler, Trainer, seed_everything
from drivetrain_jittor._dataloader import DatasetLoader

from .conftest import Points, TinyNet, jt

pytestmark = pytest.mark.jittor


def epochs_seen(dataset, n_epochs=2, **options):
    seed_everything(options.pop("seed", 0))
    model = TinyNet()
    trainer = Trainer(model, dataset, jt.optim.SGD(model.parameters(), lr=0.1), driver="jittor", device="cpu",
                      n_epochs=n_epochs, progress_bar=None, **options)
    seen: list[list[list[int]]] = [[] for _ in range(n_epochs)]
    trainer.add_callback_fn(Event.on_train_batch_begin(),
                            lambda t, batch, indices: seen[t.cur_epoch_idx].append(batch["index"].numpy().tolist()))
    trainer.run(num_eval_sanity_batch=0)
    return trainer, seen


def test_a_shuffled_dataset_is_read_through_a_resumable_sampler():
    trainer, seen = epochs_seen(Points(20, batch_size=8, shuffle=True))
    assert isinstance(trainer.dataloader, DatasetLoader)
    assert isinstance(trainer.dataloader.batch_sampler, ReproducibleBatchSampler)
    for epoch in seen:
        assert [len(b) for b in epoch] == [8, 8, 4]
        assert sorted(i for b in epoch for i in b) == list(range(20))
    assert seen[0] != seen[1], "every epoch must shuffle differently"
    assert epochs_seen(Points(20, batch_size=8, shuffle=True))[1] == seen, "seed_everything must fix the order"
    assert epochs_seen(Points(20, batch_size=8, shuffle=True), seed=1)[1] != seen


def test_drop_last_and_order_are_the_datasets():
    _, seen = epochs_seen(Points(20, batch_size=8, shuffle=False, drop_last=True), n_epochs=1)
    assert seen == [[list(range(8)), list(range(8, 16))]]


def test_jittors_own_loading_when_resuming_is_not_wanted():
    dataset = Points(20, batch_size=8, shuffle=False)
    trainer, seen = epochs_seen(dataset, n_epochs=1, reproducible_sampler=False)
    assert trainer.dataloader is dataset
    assert [i for b in seen[0] for i in b] == list(range(20))


def test_workers_are_named_in_a_warning():
    with pytest.warns(UserWarning, match="num_workers=2.*main process"):
        epochs_seen(Points(16, batch_size=8, num_workers=2), n_epochs=1)


def test_a_dataset_with_its_own_sampler_keeps_it():
    dataset = Points(12, batch_size=4)
    dataset.sampler = jt.dataset.SequentialSampler(dataset)
    trainer, seen = epochs_seen(dataset, n_epochs=1)
    assert trainer.dataloader is dataset
    assert [i for b in seen[0] for i in b] == list(range(12))


def test_a_dataset_without_a_size_says_how_to_give_one():
    class NoSize(jt.dataset.Dataset):
        def __getitem__(self, i):
            return {"x": np.zeros(4, np.float32), "target": 0}

    model = TinyNet()
    with pytest.raises(DriverError, match=r"has no size: call self.set_attrs\(total_len=N\)"):
        Trainer(model, NoSize(), jt.optim.SGD(model.parameters(), lr=0.1), driver="jittor", progress_bar=None)


def test_plain_iterables_and_numpy_batches_train(make_driver):
    rng = np.random.default_rng(0)
    batches = [{"x": rng.standard_normal((8, 4)).astype(np.float32), "target": rng.integers(0, 2, 8).astype(np.int32)}
               for _ in range(4)]
    model = TinyNet()
    trainer = Trainer(model, batches, jt.optim.SGD(model.parameters(), lr=0.1), driver="jittor", device="cpu",
                      n_epochs=1, progress_bar=None)
    assert trainer.dataloader is batches
    before = model.fc1.weight.numpy().copy()
    trainer.run(num_eval_sanity_batch=0)
    assert trainer.global_forward_batches == 4 and not np.array_equal(before, model.fc1.weight.numpy())


def test_legality_names_the_argument(make_driver, model):
    driver = make_driver(model)
    with pytest.raises(DriverError, match=r"train_dataloader=a jittor tensor of shape \(3,\) is the data itself"):
        driver.check_dataloader_legality(jt.ones((3,)), argument="train_dataloader")
    with pytest.raises(DriverError, match="evaluate_dataloaders\\['dev'\\]=int is not iterable"):
        driver.check_dataloader_legality(3, argument="evaluate_dataloaders['dev']")
    driver.check_dataloader_legality(Points(8), argument="train_dataloader")
