"""A LoRA checkpoint against a full one: bytes and save time, in one run (issue 28's goal: < 2% and < 10%).

GPT-2 small built from its config (124M parameters, random weights, nothing downloaded); a rank-8
LoRA adapter on every attention projection (``c_attn``), written here as a few lines of torch so
that the benchmark needs no ``peft`` (peft's LoRA adds the same two matrices per layer). The base is
frozen. After one training step, the same trainer writes ``Trainer.save_checkpoint`` with the frozen
base left out (the default) and with ``save_frozen=True`` (the full checkpoint), alternating, each
timed; the first adapter-only save also reads the base once for its fingerprint, shown apart.

    python bench/frozen_checkpoint.py [--rounds 5] [--folder /tmp/frozen-bench] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time

import torch
import transformers

from drivetrain import Trainer

torch.set_num_threads(1)


class LoRA(torch.nn.Module):
    """``base(x) + x @ A @ B * scale`` with ``base`` frozen; B starts at zero as in LoRA."""

    def __init__(self, base: torch.nn.Module, rank: int = 8, alpha: float = 16.0) -> None:
        super().__init__()
        self.base = base.requires_grad_(False)
        n_in, n_out = base.weight.shape  # GPT-2's Conv1D stores (in, out)
        self.lora_a = torch.nn.Parameter(torch.randn(n_in, rank) * 0.01)
        self.lora_b = torch.nn.Parameter(torch.zeros(rank, n_out))
        self.scale = alpha / rank

    def forward(self, x):
        return self.base(x) + (x @ self.lora_a @ self.lora_b) * self.scale


def build() -> torch.nn.Module:
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config())  # GPT-2 small
    model.requires_grad_(False)
    for block in model.transformer.h:
        block.attn.c_attn = LoRA(block.attn.c_attn)
    return model


def folder_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(path, name)) for name in os.listdir(path))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--folder", default=None, help="where to write (default: a temporary folder)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    model = build()
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    tokens = torch.randint(0, 50257, (2, 32), generator=torch.Generator().manual_seed(0))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    trainer = Trainer(model, [{"input_ids": tokens, "labels": tokens}], optimizer, driver="torch", device="cpu",
                      n_epochs=1, progress_bar=None)
    trainer.run(num_eval_sanity_batch=0)  # one step: Adam's moments exist
    root = args.folder or tempfile.mkdtemp(prefix="frozen-bench-")
    times: dict[str, list[float]] = {"adapter": [], "full": []}
    sizes: dict[str, int] = {}
    first = None
    for i in range(args.rounds):
        order = ("adapter", "full") if i % 2 == 0 else ("full", "adapter")
        for side in order:
            path = os.path.join(root, f"{side}-{i}")
            start = time.perf_counter()
            trainer.save_checkpoint(path, save_frozen=side == "full")
            took = time.perf_counter() - start
            if side == "adapter" and first is None:
                first = took  # includes reading the frozen base once for its fingerprint
            else:
                times[side].append(took)
            sizes[side] = folder_bytes(path)
            shutil.rmtree(path)
    result = {
        "parameters": total, "trainable": trainable,
        "bytes_adapter": sizes["adapter"], "bytes_full": sizes["full"], "bytes_ratio": sizes["adapter"] / sizes["full"],
        "seconds_adapter_median": statistics.median(times["adapter"]),
        "seconds_full_median": statistics.median(times["full"]),
        "seconds_first_adapter_save": first,
    }
    result["time_ratio"] = result["seconds_adapter_median"] / result["seconds_full_median"]
    print(f"GPT-2 small + LoRA r=8 on c_attn: {trainable:,} of {total:,} parameters train")
    print(f"checkpoint bytes: adapter {sizes['adapter']:,}, full {sizes['full']:,} "
          f"(ratio {result['bytes_ratio']:.4f}; goal < 0.02)")
    print(f"save time (median of {len(times['full'])}): adapter {result['seconds_adapter_median']:.3f} s, full "
          f"{result['seconds_full_median']:.3f} s (ratio {result['time_ratio']:.3f}; goal < 0.10); the first "
          f"adapter save, fingerprint included: {first:.3f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    if args.folder is None:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
