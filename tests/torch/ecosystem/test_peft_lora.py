"""A peft LoRA adapter on a GPT-2 built from its config: checkpoints and save_model hold the adapter only, the
save_model folder is one ``PeftModel.from_pretrained`` reads, and a resume is bit-exact."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors import safe_open
from torch.utils.data import DataLoader
from transformers import GPT2LMHeadModel

from drivetrain import (
    CheckpointCallback,
    CheckpointError,
    DrivetrainError,
    Trainer,
    export_weights,
    seed_everything,
)
from drivetrain._cli import main as cli

from ..._signals import run_until_ctrl_c
from .conftest import counting_samples, gpt2_config

peft = pytest.importorskip("peft")


def base_model(seed: int = 0) -> GPT2LMHeadModel:
    torch.manual_seed(seed)  # the "pretrained" base: the same weights for the same seed
    return GPT2LMHeadModel(gpt2_config())


def lora(model: GPT2LMHeadModel):
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn"], lora_dropout=0.0,
                             fan_in_fan_out=True, task_type="CAUSAL_LM")
    return peft.get_peft_model(model, config)


def trainer_for(model, **kwargs) -> Trainer:
    data = DataLoader(counting_samples(96, seed=0), batch_size=16, shuffle=True)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=5e-3)
    return Trainer(model, data, optimizer, driver="torch", device="cpu", n_epochs=2, progress_bar=None, **kwargs)


def test_save_model_writes_an_adapter_peft_loads(tmp_path) -> None:
    seed_everything(0)
    trainer = trainer_for(lora(base_model()))
    trainer.run(num_eval_sanity_batch=0)
    trainer.save_model(tmp_path / "adapter")
    files = sorted(os.listdir(tmp_path / "adapter"))
    assert files == ["adapter_config.json", "adapter_model.safetensors", "manifest.json", "model.safetensors"]
    trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    sizes = {name: os.path.getsize(tmp_path / "adapter" / name) for name in files}
    for name in ("adapter_model.safetensors", "model.safetensors"):  # the adapter's fp32 bytes and a header
        assert 4 * trainable <= sizes[name] < 4 * trainable + 8192, (name, sizes[name], trainable)

    loaded = peft.PeftModel.from_pretrained(base_model(), tmp_path / "adapter")
    ids = torch.arange(12).reshape(1, 12)
    trainer.model.eval()
    loaded.eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, trainer.model(input_ids=ids).logits)
    with open(tmp_path / "adapter" / "adapter_config.json") as f:
        config = json.load(f)
    assert config["r"] == 4 and config["peft_type"] == "LORA" and config["inference_mode"] is True

    # drivetrain reads its own folder back into a fresh LoRA model on the same base, and refuses another base
    fresh = trainer_for(lora(base_model()))
    fresh.load_model(tmp_path / "adapter")
    with pytest.raises(CheckpointError, match="not the ones it was trained on"):
        trainer_for(lora(base_model(seed=1))).load_model(tmp_path / "adapter")


def test_a_lora_run_resumes_bit_exactly_from_an_adapter_sized_checkpoint(tmp_path) -> None:
    seed_everything(0)
    reference = trainer_for(lora(base_model()))
    reference.run(num_eval_sanity_batch=0)

    seed_everything(0)
    first = trainer_for(lora(base_model()), callbacks=[CheckpointCallback(tmp_path / "ckpt", every_n_batches=4)])
    run_until_ctrl_c(first, 9, num_eval_sanity_batch=0)
    folder = tmp_path / "ckpt" / "step_00000008-epoch_1-batch_2"
    trainable = sum(p.numel() for p in first.model.parameters() if p.requires_grad)
    assert os.path.getsize(folder / "model.safetensors") < 4 * trainable + 8192

    resumed = trainer_for(lora(base_model()))
    resumed.run(resume_from=tmp_path / "ckpt", num_eval_sanity_batch=0)
    for name, value in reference.model.state_dict().items():
        assert torch.equal(value, resumed.model.state_dict()[name]), name


def test_a_model_that_is_not_a_peft_model_gets_no_adapter_files(tmp_path) -> None:
    trainer = trainer_for(base_model())
    trainer.run(num_eval_sanity_batch=0)
    trainer.save_model(tmp_path / "plain")
    assert sorted(os.listdir(tmp_path / "plain")) == ["manifest.json", "model.safetensors"]


def test_merge_adapters_writes_the_base_with_the_adapter_folded_in_that_from_pretrained_reads(tmp_path) -> None:
    seed_everything(0)
    trainer = trainer_for(lora(base_model()))
    trainer.run(num_eval_sanity_batch=0)
    before = {name: value.clone() for name, value in trainer.model.state_dict().items()}
    trainer.save_model(tmp_path / "merged", merge_adapters=True)
    assert sorted(os.listdir(tmp_path / "merged")) == ["config.json", "manifest.json", "model.safetensors"]
    assert all(torch.equal(value, trainer.model.state_dict()[name]) for name, value in before.items())  # unchanged

    merged = GPT2LMHeadModel.from_pretrained(tmp_path / "merged")  # no peft, no base: the folder alone
    ids = torch.arange(12).reshape(1, 12)
    trainer.model.eval()
    merged.eval()
    with torch.no_grad():
        torch.testing.assert_close(merged(input_ids=ids).logits, trainer.model(input_ids=ids).logits)
    # the same tensors peft's own merge_and_unload gives
    unloaded = trainer.model.merge_and_unload().state_dict()
    assert set(merged.state_dict()) == set(unloaded)
    for name, value in unloaded.items():
        assert torch.equal(merged.state_dict()[name], value), name

    exported = export_weights(tmp_path / "merged", tmp_path / "one.safetensors")  # one file, the whole model
    with safe_open(exported, framework="pt") as f:
        assert torch.equal(f.get_tensor("transformer.h.0.attn.c_attn.weight"), unloaded["transformer.h.0.attn.c_attn.weight"])


def test_merge_adapters_without_an_adapter_says_what_to_use(tmp_path) -> None:
    trainer = trainer_for(base_model())
    with pytest.raises(DrivetrainError, match=r"found no adapter to merge.*save_frozen=True"):
        trainer.save_model(tmp_path / "merged", merge_adapters=True)
    assert not os.path.exists(tmp_path / "merged")


def test_export_base_folds_the_adapter_folder_into_the_base_file(tmp_path) -> None:
    """From the files alone: the adapter folder save_model wrote and the base's from_pretrained folder."""
    seed_everything(0)
    trainer = trainer_for(lora(base_model()))
    trainer.run(num_eval_sanity_batch=0)
    trainer.save_model(tmp_path / "adapter")
    base_model().save_pretrained(tmp_path / "base")  # the "pretrained" base as the Hub would have it

    merged_dir = tmp_path / "merged"
    merged_dir.mkdir()
    assert cli(["export", str(tmp_path / "adapter"), "-o", str(merged_dir), "--base", str(tmp_path / "base")]) == 0
    (merged_dir / "config.json").write_bytes((tmp_path / "base" / "config.json").read_bytes())
    merged = GPT2LMHeadModel.from_pretrained(merged_dir)
    unloaded = trainer.model.merge_and_unload().state_dict()
    for name, value in merged.state_dict().items():  # numpy's B @ A against torch's: float32 rounding only
        torch.testing.assert_close(value, unloaded[name], rtol=0, atol=1e-6, msg=name)
    changed = "transformer.h.0.attn.c_attn.weight"
    assert not torch.equal(merged.state_dict()[changed], base_model().state_dict()[changed])  # the adapter is in

    base_model(seed=1).save_pretrained(tmp_path / "other-base")
    with pytest.raises(CheckpointError, match="is not the base the adapter .* was trained on"):
        export_weights(tmp_path / "adapter", tmp_path / "x.safetensors", base=tmp_path / "other-base")
    trainer.save_model(tmp_path / "whole", save_frozen=True)
    with pytest.raises(CheckpointError, match="holds no LoRA adapter"):
        export_weights(tmp_path / "whole", tmp_path / "y.safetensors", base=tmp_path / "base")
    assert not (tmp_path / "x.safetensors").exists() and not (tmp_path / "y.safetensors").exists()
