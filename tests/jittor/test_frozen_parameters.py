"""Frozen parameters with jittor (``stop_grad()``): left out of checkpoints and fingerprinted; batch norm
statistics (stopped parameters in jittor, but updated by the forward pass) kept like buffers; the resume
bit-exact; another base refused (the scenario of ``tests/_frozen_rule.py``)."""

from __future__ import annotations

import pytest

from drivetrain import Trainer

from .._frozen_rule import BATCH, check_frozen_run, pretrained, samples
from .conftest import jt

pytestmark = [pytest.mark.jittor, pytest.mark.filterwarnings("ignore:resuming mid-epoch without a reproducible")]


class Frozen(jt.Module):
    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        self.encoder = jt.nn.Linear(8, 16)
        self.encoder.weight.update(jt.array(pretrained(seed, (16, 8))))
        self.encoder.bias.update(jt.array(pretrained(seed + 10, (16,))))
        for p in self.encoder.parameters():
            p.stop_grad()
        jt.set_global_seed(0)
        self.norm = jt.nn.BatchNorm1d(16)
        self.head = jt.nn.Linear(16, 3)

    def execute(self, x, y):
        logits = self.head(jt.nn.relu(self.norm(self.encoder(x))))
        return {"loss": jt.nn.cross_entropy_loss(logits, y), "pred": logits}


def trainer_for(model, **kwargs) -> Trainer:
    x, y = samples()
    batches = [{"x": jt.array(x[i:i + BATCH]), "y": jt.array(y[i:i + BATCH])} for i in range(0, len(x), BATCH)]
    optimizer = jt.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=0.01)
    return Trainer(model, batches, optimizer, driver="jittor", device="cpu", n_epochs=2, progress_bar=None,
                   **kwargs)


def test_a_frozen_layer_is_left_out_statistics_kept_and_the_resume_is_exact(tmp_path) -> None:
    check_frozen_run(tmp_path, make_model=Frozen, trainer_for=trainer_for,
                     weights=lambda model: {k: v.numpy() for k, v in model.state_dict().items()},
                     kept={"norm.weight", "norm.bias", "norm.running_mean", "norm.running_var", "head.weight",
                           "head.bias"},
                     frozen={"encoder.weight", "encoder.bias"})
