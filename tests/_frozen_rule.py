"""The frozen-parameter scenario every backend runs: a frozen "pretrained" encoder, a batch norm and a trained head.

A reference run; the same run interrupted by Ctrl-C after step 17 with checkpoints every 5 steps; a resume from
the newest (step 15: epoch 1, batch 3 of 12). The checkpoint's model file holds the head, the norm and its
statistics but not the encoder, whose fingerprint is in the manifest; the resume is bit-exact; another base is
refused. Each backend's test gives its model, trainer and state reader.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors import safe_open

from drivetrain import CheckpointCallback, CheckpointError, Trainer, seed_everything

from ._signals import run_until_ctrl_c

N_SAMPLES, BATCH = 96, 8  # 12 batches an epoch, 2 epochs


def samples(seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Inputs of 8 features and labels in {0, 1, 2}."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((N_SAMPLES, 8)).astype("float32")
    return x, ((x[:, 0] > 0).astype("int64") + (x[:, 1] > 0).astype("int64"))


def pretrained(seed: int, shape: tuple[int, ...]) -> np.ndarray:
    """The frozen base's values: the same for the same seed."""
    return np.random.default_rng(seed).standard_normal(shape).astype("float32")


def check_frozen_run(tmp_path: Path, *, make_model: Callable[[int], Any], trainer_for: Callable[..., Trainer],
                     weights: Callable[[Any], dict[str, np.ndarray]], kept: set[str], frozen: set[str]) -> None:
    seed_everything(0)
    reference = trainer_for(make_model(0))
    reference.run(num_eval_sanity_batch=0)

    seed_everything(0)
    first = trainer_for(make_model(0), callbacks=[CheckpointCallback(tmp_path / "ckpt", every_n_batches=5)])
    run_until_ctrl_c(first, 17, num_eval_sanity_batch=0)
    folder = tmp_path / "ckpt" / "step_00000015-epoch_1-batch_3"
    with safe_open(str(folder / "model.safetensors"), "np") as f:
        assert set(f.keys()) == kept
    manifest = json.loads((folder / "manifest.json").read_text())
    assert set(manifest["frozen"]["tensors"]) == frozen

    resumed = trainer_for(make_model(0))
    resumed.run(resume_from=tmp_path / "ckpt", num_eval_sanity_batch=0)
    want, got = weights(reference.model), weights(resumed.model)
    assert sorted(want) == sorted(got)
    for name, value in want.items():
        np.testing.assert_array_equal(value, got[name], err_msg=name)
    assert not np.array_equal(want[sorted(kept)[0]], weights(make_model(0))[sorted(kept)[0]])  # it trained

    with pytest.raises(CheckpointError, match="not the ones it was trained on: their values differ"):
        trainer_for(make_model(1)).load_checkpoint(folder)
