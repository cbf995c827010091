"""Frozen parameters are not saved again and again: checkpoints and save_model keep what trains, the buffers,
and a fingerprint of the frozen base; a resume onto another base is refused; save_frozen=True writes it all.

A Hugging Face GPT-2 built from its config (random weights, nothing downloaded) with everything frozen but
the attention projections (what a LoRA run does to its base), and a small MLP with a frozen first layer.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
from safetensors import safe_open
from torch.utils.data import DataLoader, TensorDataset

from drivetrain import CheckpointCallback, CheckpointError, Trainer, export_weights, seed_everything

from .._signals import run_until_ctrl_c

torch.set_num_threads(1)


class Frozen(torch.nn.Module):
    """A frozen 'encoder' (first Linear), a trainable head, and a BatchNorm whose statistics change."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.encoder = torch.nn.Linear(8, 16)
        with torch.no_grad():
            self.encoder.weight.copy_(torch.randn(16, 8, generator=gen))  # the "pretrained" base: by its seed
            self.encoder.bias.copy_(torch.randn(16, generator=gen))
        self.encoder.requires_grad_(False)
        self.norm = torch.nn.BatchNorm1d(16)
        self.head = torch.nn.Linear(16, 3)

    def forward(self, x, y):
        logits = self.head(torch.relu(self.norm(self.encoder(x))))
        return {"loss": torch.nn.functional.cross_entropy(logits, y), "pred": logits}


def loader() -> DataLoader:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(96, 8, generator=gen)
    return DataLoader(TensorDataset(x, (x[:, 0] > 0).long() + (x[:, 1] > 0).long()), batch_size=8, shuffle=True)


def trainer_for(model, **kwargs) -> Trainer:
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=0.01)
    return Trainer(model, loader(), optimizer, driver="torch", device="cpu", n_epochs=2, progress_bar=None,
                   input_mapping=lambda batch: {"x": batch[0], "y": batch[1]}, **kwargs)


def names_in(path) -> set[str]:
    with safe_open(os.path.join(path, "model.safetensors"), "pt") as f:
        return set(f.keys())


def manifest(path) -> dict:
    with open(os.path.join(path, "manifest.json")) as f:
        return json.load(f)


def test_checkpoints_leave_the_frozen_base_out_and_resume_bit_exactly(tmp_path) -> None:
    seed_everything(0)
    reference = trainer_for(Frozen())
    reference.run(num_eval_sanity_batch=0)

    seed_everything(0)
    first = trainer_for(Frozen(), callbacks=[CheckpointCallback(tmp_path / "ckpt", every_n_batches=5)])
    run_until_ctrl_c(first, 17, num_eval_sanity_batch=0)
    folder = tmp_path / "ckpt" / "step_00000015-epoch_1-batch_3"
    assert names_in(folder) == {"norm.weight", "norm.bias", "norm.running_mean", "norm.running_var",
                                "norm.num_batches_tracked", "head.weight", "head.bias"}
    record = manifest(folder)["frozen"]
    assert {name: entry[:2] for name, entry in record["tensors"].items()} == {
        "encoder.weight": ["F32", [16, 8]], "encoder.bias": ["F32", [16]]}
    assert all(isinstance(entry[2], int) for entry in record["tensors"].values())  # the values' checksums
    assert record["bytes"] == (16 * 8 + 16) * 4

    resumed = trainer_for(Frozen())  # the same base, as from_pretrained would give it
    resumed.run(resume_from=tmp_path / "ckpt", num_eval_sanity_batch=0)
    for name, value in reference.model.state_dict().items():
        assert torch.equal(value, resumed.model.state_dict()[name]), name


def test_a_resume_onto_another_base_is_refused_and_loads_nothing(tmp_path) -> None:
    trained = trainer_for(Frozen(seed=0), callbacks=[CheckpointCallback(tmp_path / "ckpt")])
    trained.run(num_eval_sanity_batch=0)
    other = trainer_for(Frozen(seed=1))
    before = {k: v.clone() for k, v in other.model.state_dict().items()}
    with pytest.raises(CheckpointError, match=r"frozen parameters are not the ones it was trained on: their "
                                              r"values differ.*save_frozen=True.*Nothing was loaded"):
        other.load_checkpoint(tmp_path / "ckpt" / "last")
    assert all(torch.equal(v, other.model.state_dict()[k]) for k, v in before.items())

    wider = Frozen()
    wider.encoder = torch.nn.Linear(8, 16).to(torch.float64).requires_grad_(False)
    with pytest.raises(CheckpointError, match=r"dtypes or shapes differ for \['encoder.bias', 'encoder.weight'\]"):
        trainer_for(wider).load_checkpoint(tmp_path / "ckpt" / "last")


def test_save_model_keeps_the_trainable_part_and_save_frozen_the_whole_model(tmp_path) -> None:
    trainer = trainer_for(Frozen())
    trainer.run(num_eval_sanity_batch=0)
    trainer.save_model(tmp_path / "adapter")
    trainer.save_model(tmp_path / "whole", save_frozen=True)
    assert "encoder.weight" not in names_in(tmp_path / "adapter") and "frozen" in manifest(tmp_path / "adapter")
    assert "encoder.weight" in names_in(tmp_path / "whole") and "frozen" not in manifest(tmp_path / "whole")

    fresh = trainer_for(Frozen())  # the same base: the adapter folder completes it
    fresh.load_model(tmp_path / "adapter")
    for name, value in trainer.model.state_dict().items():
        assert torch.equal(value, fresh.model.state_dict()[name]), name
    with pytest.raises(CheckpointError, match=r"holds the trainable parameters only.*save_frozen=True"):
        export_weights(tmp_path / "adapter", tmp_path / "adapter.safetensors")
    exported = export_weights(tmp_path / "whole", tmp_path / "whole.safetensors")
    with safe_open(exported, "pt") as f:
        assert set(f.keys()) == set(trainer.model.state_dict())


def test_a_lora_style_gpt2_checkpoint_holds_only_what_trains(tmp_path) -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(vocab_size=128, n_positions=32, n_embd=32, n_layer=2, n_head=2)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    for name, p in model.named_parameters():
        p.requires_grad_("attn.c_attn" in name)
    tokens = torch.randint(0, 128, (16, 12), generator=torch.Generator().manual_seed(0))
    data = DataLoader([{"input_ids": row, "labels": row} for row in tokens], batch_size=4)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    trainer = Trainer(model, data, optimizer, driver="torch", device="cpu", n_epochs=1, progress_bar=None,
                      callbacks=[CheckpointCallback(tmp_path / "ckpt")])
    trainer.run(num_eval_sanity_batch=0)
    small = os.path.getsize(tmp_path / "ckpt" / "last" / "model.safetensors")
    trainer.save_model(tmp_path / "whole", save_frozen=True)
    whole = os.path.getsize(tmp_path / "whole" / "model.safetensors")
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    assert small < whole * (trainable / total + 0.05), (small, whole, trainable, total)
    # the tied embedding (wte and lm_head share it) is frozen under both names
    frozen = manifest(tmp_path / "ckpt" / "last")["frozen"]["tensors"]
    assert {"transformer.wte.weight", "lm_head.weight"} <= set(frozen)

    again = transformers.GPT2LMHeadModel(config)  # another random base: refused
    for name, p in again.named_parameters():
        p.requires_grad_("attn.c_attn" in name)
    other = Trainer(again, data, torch.optim.AdamW([p for p in again.parameters() if p.requires_grad], lr=1e-3),
                    driver="torch", device="cpu", n_epochs=1, progress_bar=None)
    with pytest.raises(CheckpointError, match="not the ones it was trained on"):
        other.load_model(tmp_path / "ckpt" / "last")
    assert np.isfinite(small)
