"""oneflow DataLoaders under the driver: reproducible sampling, what is replaced and what is left alone."""

from __future__ import annotations

import numpy as np
import pytest

from drivetrain import Event, Trainer, seed_everything
from drivetrain.backend import ReproducibleBatchSampler, find_reproducible_sampler

from .conftest import flow

pytestmark = pytest.mark.oneflow
DataLoader = flow.utils.data.DataLoader


class Numbers(flow.utils.data.Dataset):
    def __init__(self, n: int = 20) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        return {"i": np.int64(i)}


def _order(loader) -> list[int]:
    return [int(v) for batch in loader for v in batch["i"].numpy()]


def test_default_sampling_is_replaced_and_keeps_the_settings(model, make_driver) -> None:
    d = make_driver(model)
    loader = DataLoader(Numbers(), batch_size=6, shuffle=True, drop_last=True)
    repro = d.set_dist_repro_dataloader(loader, dist=None, reproducible=True)
    sampler = find_reproducible_sampler(repro)
    assert isinstance(sampler, ReproducibleBatchSampler)
    assert (sampler.batch_size, sampler.shuffle, sampler.drop_last) == (6, True, True)
    order = _order(repro)
    assert len(order) == 18 and len(set(order)) == 18
    assert d.set_dist_repro_dataloader(loader, dist=None, reproducible=False) is loader


def test_the_order_follows_seed_everything_and_changes_per_epoch(model, make_driver) -> None:
    def order(seed: int, epoch: int = 0) -> list[int]:
        seed_everything(seed)
        loader = make_driver(model).set_dist_repro_dataloader(DataLoader(Numbers(), batch_size=5, shuffle=True),
                                                              dist=None, reproducible=True)
        make_driver(model).set_sampler_epoch(loader, epoch)
        return _order(loader)

    assert order(1) == order(1)
    assert order(1) != order(2)
    assert order(1, epoch=0) != order(1, epoch=1)
    assert sorted(order(3)) == list(range(20))


def test_a_users_generator_decides_the_order(model, make_driver) -> None:
    def order(seed: int) -> list[int]:
        generator = flow.Generator()
        generator.manual_seed(seed)
        loader = DataLoader(Numbers(), batch_size=5, shuffle=True, generator=generator)
        return _order(make_driver(model).set_dist_repro_dataloader(loader, dist=None, reproducible=True))

    seed_everything(0)
    first = order(11)
    seed_everything(1)  # the global seed does not matter when the loader has its own generator
    assert order(11) == first != order(12)


def test_sequential_order_is_kept(model, make_driver) -> None:
    loader = DataLoader(Numbers(), batch_size=7)
    assert _order(make_driver(model).set_dist_repro_dataloader(loader, dist=None, reproducible=True)) == list(range(20))


def test_custom_sampling_is_left_alone(model, make_driver) -> None:
    d = make_driver(model)
    weighted = DataLoader(Numbers(), batch_size=4,
                          sampler=flow.utils.data.SubsetRandomSampler(list(range(10))))
    assert d.set_dist_repro_dataloader(weighted, dist=None, reproducible=True) is weighted
    plain = [{"i": np.arange(3)}]
    assert d.set_dist_repro_dataloader(plain, dist=None, reproducible=True) is plain


def test_resume_mid_epoch_continues_with_the_next_samples(tmp_path) -> None:
    class Recorder(flow.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = flow.nn.Parameter(flow.zeros(1))
            self.seen: list[int] = []

        def forward(self, i):
            self.seen.extend(int(v) for v in i.numpy())
            return {"loss": (self.w * i.float()).sum()}

    def build():
        seed_everything(4)
        net = Recorder()
        loader = DataLoader(Numbers(), batch_size=4, shuffle=True)
        return Trainer(net, loader, flow.optim.SGD(net.parameters(), lr=0.0), driver="oneflow", n_epochs=2,
                       progress_bar=None), net

    trainer, full = build()
    trainer.run(num_eval_sanity_batch=0)
    assert sorted(full.seen[:20]) == sorted(full.seen[20:]) == list(range(20)) and full.seen[:20] != full.seen[20:]
    trainer, _ = build()
    trainer.add_callback_fn(Event.on_train_batch_end(), lambda t: t.save_checkpoint(tmp_path / "ck")
                            if t.global_forward_batches == 3 else None)
    trainer.run(num_eval_sanity_batch=0)
    trainer, resumed = build()
    trainer.run(resume_from=tmp_path / "ck", num_eval_sanity_batch=0)
    assert resumed.seen == full.seen[12:]  # the 13th sample of epoch 0 onwards, then epoch 1's own order
