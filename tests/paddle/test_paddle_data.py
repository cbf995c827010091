"""paddle DataLoaders: the reproducible rebuild, what is left alone, workers over tensors, and
sample-exact resume mid-epoch through the Trainer."""

from __future__ import annotations

import numpy as np
import pytest

from drivetrain import Event, ReproducibleBatchSampler, Trainer, seed_everything
from drivetrain._common.errors import DriverError
from drivetrain._data.sampler import find_reproducible_sampler

from .conftest import TinyNet, paddle


class Indexed(paddle.io.Dataset):
    """Sample ``i`` is ``{"x": features, "y": label, "index": i}`` (numpy, so workers are fine)."""

    def __init__(self, n: int = 20) -> None:
        rng = np.random.default_rng(0)
        self.x = rng.standard_normal((n, 4)).astype(np.float32)
        self.y = (self.x[:, 0] > 0).astype(np.int64)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict:
        return {"x": self.x[i], "y": self.y[i], "index": np.int64(i)}


class TensorBacked(Indexed):
    def __getitem__(self, i: int) -> dict:
        return {"x": paddle.to_tensor(self.x[i]), "y": paddle.to_tensor(self.y[i])}


def _indices(loader) -> list[list[int]]:
    return [batch["index"].numpy().tolist() for batch in loader]


def _repro(driver, loader):
    return driver.set_dist_repro_dataloader(loader, dist=None, reproducible=True)


def test_default_dataloader_is_rebuilt_around_a_reproducible_sampler(model, make_driver) -> None:
    d = make_driver(model)
    collate = paddle.io.dataloader.collate.default_collate_fn
    loader = paddle.io.DataLoader(Indexed(), batch_size=4, shuffle=True, drop_last=True, collate_fn=collate,
                                  use_buffer_reader=False, timeout=0, return_list=True)
    np.random.seed(3)
    rebuilt = _repro(d, loader)
    assert rebuilt is not loader and type(rebuilt) is paddle.io.DataLoader
    sampler = find_reproducible_sampler(rebuilt)
    assert isinstance(sampler, ReproducibleBatchSampler)
    assert (sampler.batch_size, sampler.shuffle, sampler.drop_last, sampler.dataset_len) == (4, True, True, 20)
    assert rebuilt.dataset is loader.dataset and rebuilt.collate_fn is collate
    assert rebuilt.use_buffer_reader is False and rebuilt.return_list is True
    epoch0 = _indices(rebuilt)
    assert len(epoch0) == 5 and sorted(i for b in epoch0 for i in b) == list(range(20))
    state = np.random.get_state()
    assert _indices(rebuilt) == epoch0  # the order depends on (seed, epoch) only ...
    assert np.random.get_state()[1].tolist() == state[1].tolist()  # ... and iterating draws nothing from numpy
    d.set_sampler_epoch(rebuilt, 1)
    assert _indices(rebuilt) != epoch0
    np.random.seed(3)
    assert _indices(_repro(d, loader)) == epoch0  # np.random.seed decides the order, as in paddle


def test_sequential_dataloader_keeps_its_order(model, make_driver) -> None:
    d = make_driver(model)
    rebuilt = _repro(d, paddle.io.DataLoader(Indexed(10), batch_size=4))
    assert find_reproducible_sampler(rebuilt).shuffle is False
    assert _indices(rebuilt) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_other_sampling_is_left_alone(model, make_driver) -> None:
    d = make_driver(model)
    dataset = Indexed()
    custom = paddle.io.BatchSampler(sampler=paddle.io.RandomSampler(dataset, replacement=True), batch_size=4)
    weighted = paddle.io.WeightedRandomSampler([1.0] * 20, 20)
    cases = [
        paddle.io.DataLoader(dataset, batch_sampler=custom),
        paddle.io.DataLoader(dataset, batch_sampler=paddle.io.BatchSampler(sampler=weighted, batch_size=4)),
        paddle.io.DataLoader(dataset, batch_sampler=paddle.io.DistributedBatchSampler(dataset, 4)),
        paddle.io.DataLoader(dataset, batch_size=None),
        [{"x": np.zeros((2, 4), np.float32)}],
    ]
    for loader in cases:
        assert _repro(d, loader) is loader
    loader = paddle.io.DataLoader(dataset, batch_size=4, shuffle=True)
    assert d.set_dist_repro_dataloader(loader, dist=None, reproducible=False) is loader


@pytest.mark.parametrize("dist", ["train", "eval"])
def test_distributed_sharding_belongs_to_the_distributed_driver(model, make_driver, dist) -> None:
    d = make_driver(model)
    loader = paddle.io.DataLoader(Indexed(), batch_size=4)
    with pytest.raises(DriverError, match="needs the distributed paddle driver"):
        d.set_dist_repro_dataloader(loader, dist=dist, reproducible=True)


def test_workers_over_paddle_tensors_are_refused_before_paddle_crashes(model) -> None:
    loader = paddle.io.DataLoader(TensorBacked(), batch_size=4, num_workers=2)
    with pytest.raises(DriverError, match=r"^train_dataloader: a paddle.io.DataLoader with num_workers=2 over a "
                                          r"dataset whose samples hold paddle tensors.*segfault.*numpy arrays"):
        Trainer(model, loader, paddle.optimizer.SGD(parameters=model.parameters()), driver="paddle")
    evaluate = {"dev": loader}
    with pytest.raises(DriverError, match=r"^evaluate_dataloaders\['dev'\]: a paddle.io.DataLoader"):
        from drivetrain import Accuracy, Evaluator

        Evaluator(model, evaluate, {"acc": Accuracy()}, driver="paddle")
    # the same dataset without workers, and numpy samples with workers, are fine
    Trainer(model, paddle.io.DataLoader(TensorBacked(), batch_size=4), paddle.optimizer.SGD(
        parameters=model.parameters()), driver="paddle", progress_bar=None)


def test_workers_over_numpy_samples_train(model) -> None:
    loader = paddle.io.DataLoader(Indexed(32), batch_size=8, shuffle=True, num_workers=2)
    trainer = Trainer(model, loader, paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters()),
                      driver="paddle", n_epochs=2, progress_bar=None)
    assert trainer.dataloader.num_workers == 2
    trainer.run(num_eval_sanity_batch=0)
    assert trainer.global_forward_batches == 8


def test_dataloader_legality(model, make_driver) -> None:
    d = make_driver(model)
    d.check_dataloader_legality(paddle.io.DataLoader(Indexed(), batch_size=2))
    d.check_dataloader_legality([{"x": paddle.zeros([2])}], "evaluate_dataloaders")
    with pytest.raises(DriverError, match=r"^train_dataloader=Indexed is a Dataset, not a dataloader.*DataLoader\("):
        d.check_dataloader_legality(Indexed())
    with pytest.raises(DriverError, match="^evaluate_dataloaders=int is not iterable"):
        d.check_dataloader_legality(3, "evaluate_dataloaders")


@pytest.mark.parametrize("stop_at", [3, 5, 7])
def test_resume_mid_epoch_sees_exactly_the_remaining_samples(tmp_path, stop_at) -> None:
    def build():
        seed_everything(1)
        net = TinyNet()
        loader = paddle.io.DataLoader(Indexed(22), batch_size=4, shuffle=True)
        seen: list[list[int]] = []
        trainer = Trainer(net, loader, paddle.optimizer.SGD(learning_rate=0.1, parameters=net.parameters()),
                          driver="paddle", n_epochs=2, progress_bar=None)
        trainer.add_callback_fn(Event.on_train_batch_begin(), lambda t, batch, idx: seen.append(
            batch["index"].numpy().tolist()))
        return trainer, seen

    trainer, reference = build()
    trainer.run(num_eval_sanity_batch=0)
    trainer, seen = build()
    trainer.add_callback_fn(Event.on_train_batch_end(), lambda t: t.save_checkpoint(tmp_path / "ck")
                            if t.global_forward_batches == stop_at else None)
    trainer.run(num_eval_sanity_batch=0)
    trainer, resumed = build()
    trainer.run(resume_from=tmp_path / "ck", num_eval_sanity_batch=0)
    assert resumed == reference[stop_at:]
