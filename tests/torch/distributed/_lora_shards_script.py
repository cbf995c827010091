"""The program the sharded LoRA tests start under torchrun: a peft LoRA adapter on a GPT-2 built from its config,
trained by a driver that shards the model (``torch_fsdp``, or ``deepspeed`` at ZeRO-3 with nothing kept whole).

    _lora_shards_script.py DRIVER OUT PHASES [SOURCE]

Runs the comma-separated PHASES in the same processes and writes ``OUT/<phase>-rank<r>.json`` per rank:

- ``reference``: 2 epochs; the full model state at the end;
- ``interrupt``: the same run, a checkpoint into ``OUT/ckpt`` after ``STOP_AT`` batches, then stopped; the
  full model state at the checkpoint;
- ``resume``: resumed from ``OUT/ckpt``; the full model state at the end;
- ``other-base``: a LoRA model on another base (seed 1) resumed from ``OUT/ckpt``: the error it raised;
- ``load``: ``load_checkpoint(SOURCE, resume_training=False)`` at this world size: the full model state.
"""

from __future__ import annotations

import json
import os
import sys
import warnings

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
warnings.filterwarnings("ignore", category=FutureWarning)  # DeepSpeed calls torch collectives torch deprecates

import peft  # noqa: E402
import torch  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

from drivetrain import Callback, CheckpointError, EarlyStopException, Trainer  # noqa: E402

torch.set_num_threads(1)

VOCAB, SEQ_LEN, N_SAMPLES, BATCH = 64, 12, 32, 4
STOP_AT = 3
DRIVER = "torch_fsdp"


def lora_model(base_seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(base_seed)  # the "pretrained" base: the same weights for the same seed
    base = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=2, n_positions=SEQ_LEN,
                                      use_cache=False, bos_token_id=0, eos_token_id=0))
    torch.manual_seed(100)  # the adapter's initialisation, the same on every base
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn"], lora_dropout=0.0, fan_in_fan_out=True,
                             task_type="CAUSAL_LM")
    return peft.get_peft_model(base, config)


def samples() -> list[dict]:
    gen = torch.Generator().manual_seed(0)
    ids = (torch.randint(0, VOCAB, (N_SAMPLES, 1), generator=gen) + torch.arange(SEQ_LEN)) % VOCAB
    return [{"input_ids": ids[i], "labels": ids[i].clone()} for i in range(N_SAMPLES)]


class StopAt(Callback):
    def __init__(self, folder: str) -> None:
        self.folder, self.state = folder, None

    def on_train_batch_end(self, trainer) -> None:
        if trainer.global_forward_batches == STOP_AT:
            trainer.save_checkpoint(self.folder)
            self.state = full_state(trainer)
            raise EarlyStopException("interrupted on purpose")


def full_state(trainer: Trainer) -> dict[str, list[float]]:
    """Every rank: the gathered model state as lists (the trainable part and a checksum of each frozen one)."""
    state = trainer.driver.model_state()
    return {name: t.detach().float().flatten().tolist() if "lora_" in name else [float(t.double().sum())]
            for name, t in sorted(state.items())}


DRIVER_OPTIONS = {"torch_fsdp": {}, "deepspeed": {"deepspeed_kwargs": {
    "zero_stage": 3, "config": {"zero_optimization": {"stage3_param_persistence_threshold": 0}}}}}


def build(model: torch.nn.Module, callbacks: list) -> Trainer:
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=5e-3)
    return Trainer(model, DataLoader(samples(), batch_size=BATCH, shuffle=True), optimizer, driver=DRIVER,
                   n_epochs=2, callbacks=callbacks, progress_bar=None, **DRIVER_OPTIONS[DRIVER])


def run_phase(phase: str, out: str, source: str | None) -> dict:
    folder = os.path.join(out, "ckpt")
    if phase == "interrupt":
        stop = StopAt(folder)
        build(lora_model(), [stop]).run(num_eval_sanity_batch=0)
        return {"state": stop.state}
    if phase == "other-base":
        try:
            build(lora_model(base_seed=1), []).run(resume_from=folder, num_eval_sanity_batch=0)
        except CheckpointError as exc:
            return {"error": str(exc)}
        return {"error": None}
    trainer = build(lora_model(), [])
    if phase == "load":
        trainer.load_checkpoint(source, resume_training=False)
        return {"state": full_state(trainer)}
    trainer.run(resume_from=folder if phase == "resume" else None, num_eval_sanity_batch=0)
    return {"state": full_state(trainer), "steps": trainer.global_forward_batches}


def main() -> None:
    global DRIVER
    DRIVER, out, phases, *source = sys.argv[1:]
    for phase in phases.split(","):
        record = run_phase(phase, out, source[0] if source else None)
        with open(os.path.join(out, f"{phase}-rank{os.environ.get('RANK', '0')}.json"), "w") as f:
            json.dump(record, f)


if __name__ == "__main__":
    sys.exit(main())
