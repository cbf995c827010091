"""Frozen parameters with paddle: ``stop_gradient`` layers are left out of checkpoints and fingerprinted; batch
norm statistics (parameters in paddle, but updated by the forward pass) are saved like buffers; a resume is
bit-exact and a resume onto another base is refused."""

from __future__ import annotations

import json
import os

import numpy as np
import paddle
import pytest
from safetensors import safe_open

from drivetrain import CheckpointCallback, CheckpointError, Trainer, seed_everything

from .._signals import run_until_ctrl_c


class Frozen(paddle.nn.Layer):
    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        rng = np.random.default_rng(seed)
        self.encoder = paddle.nn.Linear(8, 16)
        self.encoder.weight.set_value(rng.standard_normal((8, 16)).astype("float32"))  # the "pretrained" base
        self.encoder.bias.set_value(rng.standard_normal(16).astype("float32"))
        for p in self.encoder.parameters():
            p.stop_gradient = True
        self.norm = paddle.nn.BatchNorm1D(16)
        self.head = paddle.nn.Linear(16, 3)

    def forward(self, x, y):
        logits = self.head(paddle.nn.functional.relu(self.norm(self.encoder(x))))
        return {"loss": paddle.nn.functional.cross_entropy(logits, y), "pred": logits}


def batches() -> paddle.io.DataLoader:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((96, 8)).astype("float32")
    y = ((x[:, 0] > 0).astype("int64") + (x[:, 1] > 0).astype("int64"))
    data = [{"x": x[i], "y": y[i]} for i in range(96)]
    return paddle.io.DataLoader(data, batch_size=8, shuffle=True)


def trainer_for(model, **kwargs) -> Trainer:
    optimizer = paddle.optimizer.Adam(learning_rate=0.01, parameters=[p for p in model.parameters()
                                                                      if not p.stop_gradient])
    return Trainer(model, batches(), optimizer, driver="paddle", device="cpu", n_epochs=2, progress_bar=None,
                   **kwargs)


def test_a_frozen_layer_is_left_out_statistics_kept_and_the_resume_is_exact(tmp_path) -> None:
    seed_everything(0)
    reference = trainer_for(Frozen())
    reference.run(num_eval_sanity_batch=0)

    seed_everything(0)
    first = trainer_for(Frozen(), callbacks=[CheckpointCallback(tmp_path / "ckpt", every_n_batches=5)])
    run_until_ctrl_c(first, 17, num_eval_sanity_batch=0)
    folder = tmp_path / "ckpt" / "step_00000015-epoch_1-batch_3"
    with safe_open(os.path.join(folder, "model.safetensors"), "np") as f:
        assert set(f.keys()) == {"norm.weight", "norm.bias", "norm._mean", "norm._variance", "head.weight",
                                 "head.bias"}
    with open(folder / "manifest.json") as f:
        assert set(json.load(f)["frozen"]["tensors"]) == {"encoder.weight", "encoder.bias"}

    resumed = trainer_for(Frozen())
    resumed.run(resume_from=tmp_path / "ckpt", num_eval_sanity_batch=0)
    for name, value in reference.model.state_dict().items():
        np.testing.assert_array_equal(value.numpy(), resumed.model.state_dict()[name].numpy(), err_msg=name)

    with pytest.raises(CheckpointError, match="not the ones it was trained on: their values differ"):
        trainer_for(Frozen(seed=1)).load_checkpoint(folder)
