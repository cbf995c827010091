"""Hugging Face gradient checkpointing (``gradient_checkpointing_enable()``, ``activation_checkpointing_enable()``
since transformers 5) under the Trainer, on a full model and on a LoRA-style one (frozen base, only the
attention projections train): the same training as without it, and the frozen base stays out of the checkpoint."""

from __future__ import annotations

import json

import torch
from torch.utils.data import DataLoader
from transformers import GPT2LMHeadModel

from drivetrain import CheckpointCallback, Trainer, seed_everything

from .conftest import counting_samples, gpt2_config


def train(checkpointing: bool, frozen_base: bool, folder=None) -> Trainer:
    seed_everything(0)
    model = GPT2LMHeadModel(gpt2_config())
    model.config.use_cache = False
    if frozen_base:
        for name, p in model.named_parameters():
            p.requires_grad_("attn.c_attn" in name)
    if checkpointing:
        # transformers 5 renamed gradient_checkpointing_enable (deprecated, same effect)
        (getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable)()
        assert model.is_gradient_checkpointing
        if frozen_base:
            model.enable_input_require_grads()  # what HF and peft do for a frozen embedding
    model.train()
    data = DataLoader(counting_samples(64, seed=0), batch_size=16, shuffle=True)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    callbacks = [CheckpointCallback(folder)] if folder is not None else []
    trainer = Trainer(model, data, optimizer, driver="torch", device="cpu", n_epochs=2, progress_bar=None,
                      callbacks=callbacks)
    trainer.run(num_eval_sanity_batch=0)
    return trainer


def assert_same_weights(a: Trainer, b: Trainer) -> None:
    for (name, x), y in zip(a.model.state_dict().items(), b.model.state_dict().values(), strict=True):
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-5, msg=name)


def test_gradient_checkpointing_trains_what_the_plain_model_trains() -> None:
    assert_same_weights(train(True, False), train(False, False))


def test_gradient_checkpointing_with_a_frozen_base_trains_the_adapter_and_saves_only_it(tmp_path) -> None:
    with_checkpointing = train(True, True, folder=tmp_path / "ckpt")
    assert_same_weights(with_checkpointing, train(False, True))
    with open(tmp_path / "ckpt" / "last" / "manifest.json") as f:
        frozen = json.load(f)["frozen"]["tensors"]
    assert "transformer.wte.weight" in frozen and not any("c_attn" in name for name in frozen)
