"""Frozen parameters with oneflow (``requires_grad=False``): left out of checkpoints and fingerprinted, batch norm
statistics kept, the resume bit-exact, another base refused (the scenario of ``tests/_frozen_rule.py``)."""

from __future__ import annotations

import pytest

from drivetrain import Trainer

from .._frozen_rule import BATCH, check_frozen_run, pretrained, samples

flow = pytest.importorskip("oneflow")

pytestmark = pytest.mark.oneflow


class Frozen(flow.nn.Module):
    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        self.encoder = flow.nn.Linear(8, 16)
        with flow.no_grad():
            self.encoder.weight.copy_(flow.tensor(pretrained(seed, (16, 8))))
            self.encoder.bias.copy_(flow.tensor(pretrained(seed + 10, (16,))))
        self.encoder.requires_grad_(False)
        flow.manual_seed(0)
        self.norm = flow.nn.BatchNorm1d(16)
        self.head = flow.nn.Linear(16, 3)

    def forward(self, x, y):
        logits = self.head(flow.relu(self.norm(self.encoder(x))))
        return {"loss": flow.nn.functional.cross_entropy(logits, y), "pred": logits}


def trainer_for(model, **kwargs) -> Trainer:
    x, y = samples()
    data = [{"x": flow.tensor(x[i]), "y": flow.tensor(y[i])} for i in range(len(x))]
    optimizer = flow.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=0.01)
    return Trainer(model, flow.utils.data.DataLoader(data, batch_size=BATCH, shuffle=True), optimizer,
                   driver="oneflow", device="cpu", n_epochs=2, progress_bar=None, **kwargs)


def test_a_frozen_layer_is_left_out_statistics_kept_and_the_resume_is_exact(tmp_path) -> None:
    check_frozen_run(tmp_path, make_model=Frozen, trainer_for=trainer_for,
                     weights=lambda model: {k: v.numpy() for k, v in model.state_dict().items()},
                     kept={"norm.weight", "norm.bias", "norm.running_mean", "norm.running_var",
                           "norm.num_batches_tracked", "head.weight", "head.bias"},
                     frozen={"encoder.weight", "encoder.bias"})
