"""Frozen parameters with paddle (``stop_gradient``): left out of checkpoints and fingerprinted; batch norm
statistics (parameters in paddle, but updated by the forward pass) saved like buffers; the resume bit-exact;
another base refused (the scenario of ``tests/_frozen_rule.py``)."""

from __future__ import annotations

import paddle

from drivetrain import Trainer

from .._frozen_rule import BATCH, check_frozen_run, pretrained, samples


class Frozen(paddle.nn.Layer):
    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        self.encoder = paddle.nn.Linear(8, 16)
        self.encoder.weight.set_value(pretrained(seed, (8, 16)))  # paddle keeps a Linear weight as [in, out]
        self.encoder.bias.set_value(pretrained(seed + 10, (16,)))
        for p in self.encoder.parameters():
            p.stop_gradient = True
        paddle.seed(0)
        self.norm = paddle.nn.BatchNorm1D(16)
        self.head = paddle.nn.Linear(16, 3)

    def forward(self, x, y):
        logits = self.head(paddle.nn.functional.relu(self.norm(self.encoder(x))))
        return {"loss": paddle.nn.functional.cross_entropy(logits, y), "pred": logits}


def trainer_for(model, **kwargs) -> Trainer:
    x, y = samples()
    data = [{"x": x[i], "y": y[i]} for i in range(len(x))]
    optimizer = paddle.optimizer.Adam(learning_rate=0.01, parameters=[p for p in model.parameters()
                                                                      if not p.stop_gradient])
    return Trainer(model, paddle.io.DataLoader(data, batch_size=BATCH, shuffle=True), optimizer, driver="paddle",
                   device="cpu", n_epochs=2, progress_bar=None, **kwargs)


def test_a_frozen_layer_is_left_out_statistics_kept_and_the_resume_is_exact(tmp_path) -> None:
    check_frozen_run(tmp_path, make_model=Frozen, trainer_for=trainer_for,
                     weights=lambda model: {k: v.numpy() for k, v in model.state_dict().items()},
                     kept={"norm.weight", "norm.bias", "norm._mean", "norm._variance", "head.weight", "head.bias"},
                     frozen={"encoder.weight", "encoder.bias"})
