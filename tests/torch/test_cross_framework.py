"""Weights written by paddle, jittor and oneflow (the committed folders of ``tests/data/cross_framework``, made by
``python -m tests._cross_generate <framework>``) load into the same network in torch with the same logits."""

from __future__ import annotations

import pytest

from tests._cross_models import TOLERANCE, committed_difference

pytest.importorskip("torch")


@pytest.mark.parametrize("source", ["paddle", "jittor", "oneflow"])
def test_a_folder_written_in_another_framework_gives_the_same_logits(source):
    difference = committed_difference("torch", source)
    print(f"{source} -> torch (committed folder): max abs logit difference {difference:.3g}")
    assert difference <= TOLERANCE
