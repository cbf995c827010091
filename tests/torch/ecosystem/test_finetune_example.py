"""examples/finetune_lm.py at its tiny size: LoRA with peft, warmup + cosine, accumulation, perplexity, an
adapter-only checkpoint resumed after Ctrl-C to the same end, the adapter reloaded by peft and generating."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

pytest.importorskip("peft")

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "..", "examples", "finetune_lm.py")


def run(*argv: str) -> dict:
    spec = importlib.util.spec_from_file_location("finetune_lm", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main(list(argv))


def test_the_example_learns_resumes_exactly_and_peft_reloads_its_adapter(tmp_path) -> None:
    whole = run("--out", str(tmp_path / "whole"))
    assert whole["steps"] == 128 and whole["ppl"] < 40  # from ~64 (a uniform guess over 64 tokens)
    assert whole["generated"][4:] == [14, 15, 16, 17, 18, 19]  # it learned to count, through peft's reload
    assert whole["adapter_files"] == ["adapter_config.json", "adapter_model.safetensors", "manifest.json",
                                      "model.safetensors"]
    assert whole["best"] is not None and "topk-ppl" in whole["best"]

    assert run("--out", str(tmp_path / "broken"), "--stop-after", "40") == {"steps": 40, "interrupted": True}
    resumed = run("--out", str(tmp_path / "broken"))  # the same command again: resume_from="latest"
    assert resumed["steps"] == 128 and resumed["generated"] == whole["generated"]
    first = load_file(tmp_path / "whole" / "adapter" / "adapter_model.safetensors")
    second = load_file(tmp_path / "broken" / "adapter" / "adapter_model.safetensors")
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)


def test_the_example_prints_no_other_librarys_warning(tmp_path) -> None:
    """transformers' ``bos_token_id ... 50256`` and ``loss_type=None`` and peft's FutureWarning were printed on every
    run: their causes are fixed in the example, so a run shows drivetrain's lines only."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "default"}
    done = subprocess.run([sys.executable, EXAMPLE, "--out", str(tmp_path / "run"), "--epochs", "1"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    foreign = [line for line in done.stderr.splitlines()
               if "Warning" in line or line.startswith("[transformers]") or "warnings.warn" in line]
    assert not foreign, "\n".join(foreign)
