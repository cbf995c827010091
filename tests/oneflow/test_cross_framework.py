"""Weights written by torch, paddle and jittor (the committed folders of ``tests/data/cross_framework``, made by
``python -m tests._cross_generate <framework>`` in their envs: this env has oneflow only) load into the same
network in oneflow with the same logits, and oneflow's own folder goes out the same way (``drivetrain convert``)."""

from __future__ import annotations

import os

import numpy as np
import pytest

import drivetrain
from tests._cross_models import DATA, TOLERANCE, committed_difference, logits, max_difference, oneflow_net

pytest.importorskip("oneflow")


@pytest.mark.parametrize("source", ["torch", "paddle", "jittor"])
def test_a_folder_written_in_another_framework_gives_the_same_logits(source):
    difference = committed_difference("oneflow", source)
    print(f"{source} -> oneflow (committed folder): max abs logit difference {difference:.3g}")
    assert difference <= TOLERANCE


def test_a_paddle_folder_converted_without_paddle_loads_here(tmp_path):
    """The paddle folder records its own layout, so no paddle backend is needed to convert it."""
    out = drivetrain.convert_weights(os.path.join(DATA, "paddle", "model"), "oneflow", str(tmp_path / "of"))
    probe = np.load(os.path.join(DATA, "paddle", "probe.npz"))
    model = drivetrain.load_weights(oneflow_net(), out)  # driver="auto": the model says oneflow
    assert max_difference(logits("oneflow", model, probe["x"]), probe["logits"]) <= TOLERANCE
