"""The ecosystem tests run offline, and transformers brings no other deep-learning framework along."""

from __future__ import annotations

import os
import subprocess
import sys


def test_importing_transformers_imports_no_other_framework() -> None:
    code = ("import sys, transformers, transformers.models.bert, transformers.models.gpt2; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'tensorflow', 'jax', 'flax', 'keras'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=120)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_the_hub_is_switched_off() -> None:
    assert os.environ["HF_HUB_OFFLINE"] == "1"
    import huggingface_hub.constants

    assert huggingface_hub.constants.HF_HUB_OFFLINE
