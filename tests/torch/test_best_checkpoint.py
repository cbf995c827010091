"""The best model with torch: top-k by accuracy, then load_best_model restores exactly the best checkpoint's weights."""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")

from safetensors.torch import load_file  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from drivetrain import Accuracy, CheckpointCallback, Event, Trainer  # noqa: E402

pytestmark = pytest.mark.torch


class Classifier(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.hidden = torch.nn.Linear(4, 16)
        self.out = torch.nn.Linear(16, 3)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> dict:
        logits = self.out(torch.relu(self.hidden(x)))
        return {"loss": torch.nn.functional.cross_entropy(logits, target), "pred": logits}


def _data(n: int, seed: int) -> TensorDataset:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=gen)
    target = ((x[:, 0] > 0).long() + (x[:, 1] > 0.5).long())
    flip = torch.rand(n, generator=gen) < 0.2  # label noise, so the accuracy goes up and down
    target[flip] = torch.randint(0, 3, (int(flip.sum()),), generator=gen)
    return TensorDataset(x, target)


def _trainer(folder, **checkpoint_options) -> tuple[Trainer, dict]:
    torch.manual_seed(0)
    model = Classifier()
    snapshots: dict = {}  # step -> (accuracy, weights) at every evaluation
    trainer = Trainer(
        model, DataLoader(_data(96, 0), batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(1)),
        torch.optim.SGD(model.parameters(), lr=0.8), driver="torch", device="cpu", n_epochs=3,
        evaluate_dataloaders=DataLoader(_data(64, 1), batch_size=32), metrics={"acc": Accuracy()}, monitor="acc",
        evaluate_every=3, callbacks=[CheckpointCallback(folder, topk=2, **checkpoint_options)], progress_bar=None)

    def snapshot(t, results):
        weights = {k: v.detach().clone() for k, v in t.model.state_dict().items()}
        snapshots[t.global_forward_batches] = (results["acc#acc"], weights)

    trainer.add_callback_fn(Event.on_evaluate_end(), snapshot)
    return trainer, snapshots


def _assert_weights(model: torch.nn.Module, expected: dict) -> None:
    state = model.state_dict()
    assert sorted(state) == sorted(expected)
    for name, tensor in expected.items():
        torch.testing.assert_close(state[name], tensor, rtol=0, atol=0)


def test_load_best_model_restores_the_best_checkpoint_exactly(tmp_path):
    trainer, snapshots = _trainer(tmp_path)
    trainer.run(num_eval_sanity_batch=0)
    accuracies = {step: acc for step, (acc, _) in snapshots.items()}
    best_step = min(accuracies, key=lambda s: (-accuracies[s], s))  # the first evaluation with the top accuracy
    best_acc, best_weights = snapshots[best_step]
    assert best_step != trainer.global_forward_batches, "the scenario should end away from its best"
    assert trainer.best_checkpoint == os.path.join(tmp_path, f"topk-acc_{best_acc:.6g}-step_{best_step:08d}")
    final = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    assert any(not torch.equal(final[k], best_weights[k]) for k in final)

    assert trainer.load_best_model() == trainer.best_checkpoint
    _assert_weights(trainer.model, best_weights)
    _assert_weights(trainer.model, load_file(os.path.join(trainer.best_checkpoint, "model.safetensors")))


def test_load_best_model_at_end_with_torch(tmp_path):
    trainer, snapshots = _trainer(tmp_path, load_best_model_at_end=True)
    trainer.run(num_eval_sanity_batch=0)
    best_step = int(trainer.best_checkpoint.rsplit("step_", 1)[1])
    _assert_weights(trainer.model, snapshots[best_step][1])
    last = load_file(os.path.join(tmp_path, "last", "model.safetensors"))  # `last` keeps the end of training
    assert any(not torch.equal(last[k], snapshots[best_step][1][k]) for k in last)
