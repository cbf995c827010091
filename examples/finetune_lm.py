"""Fine-tune a causal language model with LoRA, the way the LLM users of this project do, on any machine.

A GPT-2 built from its config (``--size tiny`` for CI, ``--size small`` for GPT-2 small's 124M; random
weights stand in for the pretrained ones: nothing is downloaded), a peft LoRA adapter on the attention
projections, warmup + cosine learning rate, gradient accumulation, bf16 where the device has it (and
``--bf16`` asks), evaluation perplexity, checkpoints that hold the adapter only and resume exactly
(``resume_from="latest"``: run it again after Ctrl-C or a kill), then the adapter saved in peft's format, reloaded
with ``PeftModel.from_pretrained`` and asked for a few tokens. The data: sequences that count upwards
modulo the vocabulary, a pattern a small model learns in a minute.

    python examples/finetune_lm.py --out runs/finetune            # tiny, CPU, about 20 s
    python examples/finetune_lm.py --out runs/gpt2 --size small --device cuda --bf16 --epochs 1
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import time
import warnings

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

SIZES = {"tiny": dict(n_embd=64, n_layer=2, n_head=4), "small": dict(n_embd=768, n_layer=12, n_head=12)}


class Counting(Dataset):
    """``{"input_ids", "labels"}`` rows that count up by one from a random start (labels = inputs: the model
    shifts them)."""

    def __init__(self, n: int, length: int, vocab: int, seed: int) -> None:
        starts = torch.randint(0, vocab, (n, 1), generator=torch.Generator().manual_seed(seed))
        self.ids = (starts + torch.arange(length)) % vocab

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def base_model(size: str, vocab: int, length: int):
    """GPT-2 from its config, for this toy vocabulary: no begin or end token (GPT-2's 50256 is not in it), and the
    causal-LM loss named (transformers cannot tell it from the class name GPT2LMHeadModel, and says so)."""
    import transformers

    config = transformers.GPT2Config(vocab_size=vocab, n_positions=length, use_cache=False, bos_token_id=None,
                                     eos_token_id=None, **SIZES[size])
    model = transformers.GPT2LMHeadModel(config)
    model.loss_type = "ForCausalLM"
    return model


@contextlib.contextmanager
def peft_reads_a_deprecated_property():
    """peft 0.21 (the newest) asks every model for ``is_gradient_checkpointing``, which transformers 5 deprecated:
    a FutureWarning that no setting of this script causes. Only that warning, only around peft's two calls, is
    not shown; every other warning is."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        yield


def build_model(size: str, vocab: int, length: int):
    """The base model (from its config: the same weights for the same seed) with a LoRA adapter."""
    import peft

    torch.manual_seed(0)
    base = base_model(size, vocab, length)
    lora = peft.LoraConfig(r=16, lora_alpha=32, target_modules=["c_attn", "c_fc", "c_proj"], lora_dropout=0.0,
                           fan_in_fan_out=True, task_type="CAUSAL_LM")
    with peft_reads_a_deprecated_property():
        return peft.get_peft_model(base, lora)


def main(argv: list[str] | None = None) -> dict:
    from drivetrain import CheckpointCallback, Event, Metric, Trainer, WarmupSchedule, seed_everything

    class Perplexity(Metric):
        """exp(mean next-token cross-entropy) over the evaluation set, from the model's own loss."""

        result_names = ("ppl",)

        def __init__(self) -> None:
            super().__init__()
            self.register_element("loss_sum", 0.0)
            self.register_element("batches", 0.0)

        def update(self, loss) -> None:
            self.loss_sum += float(np.mean(loss))
            self.batches += 1

        def get_metric(self) -> dict:
            return {"ppl": math.exp(float(self.loss_sum) / max(float(self.batches), 1.0))}

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="folder for checkpoints and the adapter")
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--bf16", action="store_true", help="train in bf16 autocast (CPU and recent GPUs)")
    parser.add_argument("--stop-after", type=int, default=None,
                        help="press Ctrl-C after this many steps (run the script again to resume)")
    args = parser.parse_args(argv)

    vocab, length = 64, 32
    seed_everything(0)
    model = build_model(args.size, vocab, length)
    train = DataLoader(Counting(512, length, vocab, seed=0), batch_size=16, shuffle=True)
    dev = DataLoader(Counting(64, length, vocab, seed=1), batch_size=32)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    checkpoints = CheckpointCallback(os.path.join(args.out, "checkpoints"), every_n_batches=8, keep_last_n=2,
                                     topk=1, monitor="ppl", larger_better=False)
    trainer = Trainer(model, train, optimizer, driver="torch", device=args.device, n_epochs=args.epochs,
                      accumulation_steps=2, precision="bf16" if args.bf16 else None,
                      evaluate_dataloaders={"dev": dev}, metrics={"ppl": Perplexity()}, evaluate_every=-1,
                      callbacks=[WarmupSchedule("cosine", warmup_ratio=0.1), checkpoints],
                      progress_bar="raw")
    if args.stop_after:
        def ctrl_c(t):
            if t.global_forward_batches == args.stop_after:
                raise KeyboardInterrupt

        trainer.add_callback_fn(Event.on_train_batch_end(), ctrl_c)
    started = time.perf_counter()
    try:
        trainer.run(resume_from="latest", num_eval_sanity_batch=0)  # the first start, and every restart
    except KeyboardInterrupt:
        return {"steps": trainer.global_forward_batches, "interrupted": True}
    seconds = time.perf_counter() - started

    adapter = os.path.join(args.out, "adapter")
    trainer.save_model(adapter)  # adapter_model.safetensors + adapter_config.json (peft's files) + drivetrain's
    import peft

    torch.manual_seed(0)
    with peft_reads_a_deprecated_property():
        reloaded = peft.PeftModel.from_pretrained(base_model(args.size, vocab, length), adapter).eval()
    prompt = torch.tensor([[10, 11, 12, 13]])
    with torch.no_grad():
        generated = reloaded.generate(input_ids=prompt, max_new_tokens=6, do_sample=False, pad_token_id=0,
                                      attention_mask=torch.ones_like(prompt))
    result = {"steps": trainer.global_forward_batches, "ppl": trainer.history["evaluate"][-1]["ppl#ppl#dev"],
              "generated": generated[0].tolist(), "seconds": seconds, "best": trainer.best_checkpoint,
              "adapter_files": sorted(os.listdir(adapter))}
    print(f"steps {result['steps']}, dev perplexity {result['ppl']:.3f}, {seconds:.1f} s; "
          f"generated from [10, 11, 12, 13]: {result['generated'][4:]}")
    return result


if __name__ == "__main__":
    main()
