"""Data that JAX users bring: drivetrain_jax's framework-free DataLoader, a torch DataLoader with a numpy collate (the
JAX documentation's recipe), a plain list of numpy batches; a run stopped mid-epoch and resumed sees the same
samples and ends with bit-identical parameters (dropout, batch norm, Adam, accumulation)."""

from __future__ import annotations

import numpy as np
import optax
import pytest
from flax import nnx

from drivetrain import CallbackError, CheckpointCallback, Event, Trainer, seed_everything
from drivetrain.backend import ReproducibleBatchSampler, find_reproducible_sampler
from drivetrain.testing import ArrayDataset
from drivetrain_jax import DataLoader, numpy_collate

from .conftest import MLP, logits_loss


def dataset(n: int = 60, seed: int = 0) -> ArrayDataset:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 16)).astype(np.float32)
    return ArrayDataset(x, (x[:, 0] > 0).astype(np.int32) + 2 * (x[:, 1] > 0).astype(np.int32))


def torch_loader(batch_size: int = 8):
    torch = pytest.importorskip("torch")
    return torch.utils.data.DataLoader(dataset(), batch_size=batch_size, shuffle=True, collate_fn=numpy_collate)


def train(make_loader, *, callbacks=(), n_epochs: int = 2, resume_from=None, stop_at: int | None = None):
    """An MLP with dropout and batch norm, Adam, accumulation over 2 batches, on ``make_loader()`` built after
    ``seed_everything(0)``; ``(trainer, the batches' first features, in order)``."""
    seed_everything(0)
    loader = make_loader()
    model = MLP(16, 32, 4, rngs=nnx.Rngs(0))
    trainer = Trainer(model, loader, nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param), driver="jax",
                      n_epochs=n_epochs, accumulation_steps=2, loss_fn=logits_loss, callbacks=list(callbacks),
                      progress_bar=None)
    seen: list[float] = []
    trainer.add_callback_fn(Event.on_train_batch_begin(), lambda t, batch, indices: seen.append(
        float(np.asarray(batch["x"])[0, 0])))
    if stop_at is not None:
        def stop(t):
            if t.global_forward_batches == stop_at:
                raise RuntimeError("stopped on purpose")

        trainer.add_callback_fn(Event.on_train_batch_end(), stop)
        with pytest.raises(CallbackError, match="stopped on purpose"):
            trainer.run(catch_KeyboardInterrupt=False)
    else:
        trainer.run(resume_from=resume_from)
    return trainer, seen


def flat(model) -> dict[str, np.ndarray]:
    return {".".join(map(str, p)): np.asarray(v.get_raw_value()) for p, v in
            nnx.to_flat_state(nnx.state(model, nnx.Not(nnx.RngKey)))}


@pytest.mark.parametrize("make_loader", [lambda: DataLoader(dataset(), batch_size=8, shuffle=True), torch_loader],
                         ids=["drivetrain_jax.DataLoader", "torch DataLoader"])
def test_a_run_resumed_mid_epoch_sees_the_same_samples_and_ends_bit_identical(tmp_path, make_loader):
    reference, order = train(make_loader)
    assert isinstance(find_reproducible_sampler(reference.dataloader), ReproducibleBatchSampler)
    save = CheckpointCallback(tmp_path, every_n_batches=3, save_last=False)
    train(make_loader, callbacks=[save], stop_at=13)  # 8 batches an epoch: the checkpoint of batch 12 is mid-cycle
    resumed, rest = train(make_loader, callbacks=[save], resume_from=tmp_path)
    assert rest == order[12:]
    want, got = flat(reference.model), flat(resumed.model)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def test_the_jax_documentations_collate_and_a_list_of_numpy_batches_train(tmp_path):
    torch = pytest.importorskip("torch")
    import jax

    def jax_docs_collate(batch):  # "Training a simple neural network, with PyTorch data loading"
        return jax.tree.map(np.asarray, torch.utils.data.default_collate(batch))

    loader = torch.utils.data.DataLoader(dataset(), batch_size=8, collate_fn=jax_docs_collate)
    trainer, _ = train(lambda: loader, n_epochs=1)
    assert trainer.global_forward_batches == 8
    default = torch.utils.data.DataLoader(dataset(), batch_size=8)  # torch tensors in the batch: moved too
    assert train(lambda: default, n_epochs=1)[0].global_forward_batches == 8
    batches = [numpy_collate([dataset()[i] for i in range(j, j + 10)]) for j in range(0, 60, 10)]
    assert train(lambda: batches, n_epochs=1)[0].global_forward_batches == 6


def test_the_loader_batches_any_len_getitem_dataset_without_a_framework():
    pairs = [(np.full(3, i, np.float32), i) for i in range(10)]  # a list of tuples is a dataset too
    loader = DataLoader(pairs, batch_size=4, drop_last=True)
    batches = list(loader)
    assert len(loader) == 2 and [b[1].tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert batches[0][0].shape == (4, 3)
    shuffled = DataLoader(pairs, batch_size=5, shuffle=True, seed=3)
    first = [b[1].tolist() for b in shuffled]
    shuffled.set_epoch(1)
    assert sorted(sum(first, [])) == list(range(10)) and [b[1].tolist() for b in shuffled] != first
    with pytest.raises(TypeError, match="needs __len__ and __getitem__"):
        DataLoader(iter(pairs))
