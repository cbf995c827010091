"""The program the DeepSpeed tests start: under torchrun (2 ranks, gloo on CPU), alone (a world of one), or with
``--nproc 2`` (the Trainer starts rank 1).

    _deepspeed_script.py OUT PHASES [--other DIR] [--nproc 2]

Runs the comma-separated PHASES one after another in the same processes and writes
``OUT/<phase>-rank<r>.json`` per rank: the full model state, the history, the samples seen.
Every phase trains the FSDP tests' ``Net`` (their data and settings: 2 epochs, accumulation 2,
clipping by norm, AdamW) from the same seed.

- ``ctrl-c``, ``resume``, ``straight``: ``tests/_ctrl_c_rule.py``'s (Ctrl-C, then resume), ZeRO-3 without
  accumulation;
- ``ddp``: ``driver="torch"`` (DDP), the reference; ``zero2`` / ``zero3``: ``driver="deepspeed"``
  at that stage, with evaluation on an odd-sized set each epoch, then evaluate(), predict()
  and save_model() (zero3);
- ``interrupt``: ZeRO-3 stopped after ``INTERRUPT_AT`` batches with a checkpoint in
  ``OUT/interrupted``; ``ddp-interrupt`` the same with DDP into ``OUT/ddp-interrupted``;
- ``resume-same``: ZeRO-3 resumed from ``OUT/interrupted``; ``zero2-resume``: ZeRO-2 resumed from it;
- ``resume-other`` / ``ddp-resume-other``: ZeRO-3 / ``driver="torch"`` resumed from ``--other``
  (a checkpoint another world size wrote);
- ``lean``, ``lean-interrupt``, ``lean-resume``: ZeRO-3 with no parameter kept whole on every rank
  (``stage3_param_persistence_threshold: 0``), whole, stopped into ``OUT/lean-interrupted``, resumed;
  ``lean-resume-other``: resumed from ``--other``; ``fsdp-resume-lean`` / ``ddp-resume-lean``:
  ``driver="torch_fsdp"`` / ``"torch"`` resuming ``OUT/lean-interrupted``; ``fsdp-interrupt``:
  torch_fsdp stopped into ``OUT/fsdp-interrupted``, which ``lean-resume-fsdp`` and ``ddp-resume-fsdp`` resume;
- ``zero2-interrupt``: ZeRO-2 stopped into ``OUT/zero2-interrupted``, which ``zero2-resume-own``,
  ``lean-resume-zero2`` (ZeRO-3) and ``ddp-resume-zero2`` resume; ``zero2-resume-other``: ZeRO-2 resuming
  ``--other``;
- ``bf16``, ``bf16-interrupt``, ``bf16-resume``: ZeRO-3 with bf16 weights (DeepSpeed's bf16 optimizer,
  fp32 master weights): whole, stopped into ``OUT/bf16-interrupted``, resumed;
- ``full``, ``full-interrupt``, ``full-resume``: ZeRO-3 with ``state_dict="full"`` (the state gathered, rank 0
  writes one file): whole, stopped into ``OUT/full-interrupted``, resumed; ``ddp-resume-full``: ``driver="torch"``
  resuming it;
- ``existing-group``: ZeRO-3 in a process group the script started itself (``init_process_group("gloo")``
  before the Trainer), which the driver uses and leaves to it (launched on its own: the group stays);
- ``gpt2``: a tiny Hugging Face GPT-2 (tied input/output embeddings) trained under ZeRO-3 with no parameter kept
  whole, then ``save_model`` into ``OUT/gpt2-model``;
- ``config-optimizer``: ZeRO-2 with the optimizer, clipping and batch size given in a JSON config;
- ``fixed`` / ``fixed-resume-other``: ZeRO-3 with the config's ``train_micro_batch_size_per_gpu`` fixed to the
  train dataloader's, evaluating each epoch, then evaluate() and predict(), with dataloaders of other batch sizes
  (whole / resumed from ``--other``): only the train dataloader is held to the config's micro-batch;
- ``bad-batch`` / ``bad-accumulation``: a config contradicting the dataloader's batch size / the
  Trainer's accumulation (the refusal is recorded);
- ``load-other``: ZeRO-3 loads ``--other`` (``load_checkpoint(resume_training=False)``) and records the weights
  it then holds, untrained;
- ``kill``: rank 1 writes ``OUT/pid-rank1`` and waits in batch 3 to be killed (with ``--nproc 2``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings

os.environ.setdefault("OMP_NUM_THREADS", "1")
warnings.filterwarnings("ignore", category=FutureWarning)  # DeepSpeed calls torch collectives torch deprecates

import torch  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from drivetrain import Accuracy, Callback, DriverError, Trainer  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # torchrun runs this file by path
from _ddp_script import Points  # noqa: E402
from _fsdp_script import (  # noqa: E402
    ACCUMULATION,
    BATCH_PER_RANK,
    EVAL_BATCH,
    GRAD_CLIP,
    INTERRUPT_AT,
    N_EPOCHS,
    N_EVAL,
    N_TRAIN,
    Net,
    Recorder,
    StopAt,
    state_lists,
)

torch.set_num_threads(1)
EVALUATING = ("zero2", "zero3", "fixed", "fixed-resume-other")
PREDICT_BATCH = 5  # neither the train (BATCH_PER_RANK) nor the evaluation (EVAL_BATCH) batch size

__all__ = ["ACCUMULATION", "BATCH_PER_RANK", "GRAD_CLIP", "INTERRUPT_AT", "N_TRAIN", "Net"]


class WaitToBeKilled(Callback):
    def __init__(self, out: str) -> None:
        self.out = out

    def on_train_batch_begin(self, trainer, batch, indices) -> None:
        rank = trainer.driver.rank
        if trainer.global_forward_batches == 3 and rank == 1:
            path = os.path.join(self.out, f"pid-rank{rank}")
            with open(path + ".tmp", "w") as f:  # renamed once written: the test reads it as soon as it exists
                f.write(str(os.getpid()))
            os.replace(path + ".tmp", path)
            time.sleep(3600)


def build_trainer(model, *, driver: str, callbacks: list, evaluate: bool = False, optimizer: bool = True,
                  **options) -> Trainer:
    train = DataLoader(Points(N_TRAIN, seed=0), batch_size=BATCH_PER_RANK, shuffle=True)
    extra = {"evaluate_dataloaders": DataLoader(Points(N_EVAL, seed=1), batch_size=EVAL_BATCH),
             "metrics": {"acc": Accuracy()}} if evaluate else {}
    options = {"accumulation_steps": ACCUMULATION, "grad_clip": GRAD_CLIP, "n_epochs": N_EPOCHS, "log_every_n_steps": 2,
               **options}
    opt = torch.optim.AdamW(model.parameters(), lr=0.01) if optimizer else None
    return Trainer(model, train, opt, driver=driver, callbacks=callbacks, progress_bar=None, **extra, **options)


def loaded_forward_diff(driver) -> float:
    """Load other weights into the trained driver; how far its forward then is from a plain model's with them."""
    weights = {name: torch.full_like(t, 0.01) + 0.001 * torch.arange(t.numel()).reshape(t.shape)
               for name, t in driver.model_state().items()}
    driver.load_model_state(weights)
    reference = Net()
    reference.load_state_dict(weights)
    x = torch.linspace(-1, 1, 20).reshape(5, 4)
    driver.set_model_mode("eval")
    with torch.no_grad():
        got = driver.unwrap_model()(x)["pred"]
    driver.set_model_mode("train")
    return float((got - reference(x)["pred"]).abs().max())


GPT2_SETTINGS = {"vocab_size": 50, "n_positions": 16, "n_embd": 16, "n_layer": 2, "n_head": 2, "use_cache": False}


def run_gpt2(args: argparse.Namespace) -> None:
    """A model nobody here wrote, from its config: ZeRO-3 partitions the tied embedding like any other weight."""
    import transformers

    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**GPT2_SETTINGS))
    ids = torch.randint(0, 50, (16, 16), generator=torch.Generator().manual_seed(3))
    loader = DataLoader(ids, batch_size=2, collate_fn=lambda rows: {"input_ids": torch.stack(rows),
                                                                    "labels": torch.stack(rows)})
    lean = {"zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}
    trainer = Trainer(model, loader, torch.optim.AdamW(model.parameters(), lr=0.01), driver="deepspeed",
                      deepspeed_kwargs={"config": lean}, n_epochs=1, progress_bar=None)
    trainer.run()
    trainer.save_model(os.path.join(args.out, "gpt2-model"))
    d = trainer.driver
    with open(os.path.join(args.out, f"gpt2-rank{d.rank}.json"), "w") as f:
        json.dump({"params": state_lists(d.model_state())}, f)


def ctrl_c_phase(phase: str, args: argparse.Namespace) -> None:
    """A phase of ``tests/_ctrl_c_rule.py`` (Ctrl-C, then resume) on this script's run: ZeRO-3, no accumulation."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
    from tests._ctrl_c_rule import run_phase as run_rule_phase

    def make_trainer(n_epochs: int, callbacks: list, **options) -> Trainer:
        torch.manual_seed(0)
        return build_trainer(Net(), driver="deepspeed", callbacks=callbacks, accumulation_steps=1, n_epochs=n_epochs,
                             deepspeed_kwargs={"zero_stage": 3}, **options)

    run_rule_phase(phase, args.out, make_trainer)


def run_phase(phase: str, args: argparse.Namespace) -> None:
    if phase == "gpt2":
        run_gpt2(args)
        return
    if phase in ("ctrl-c", "resume", "straight"):
        ctrl_c_phase(phase, args)
        return
    torch.manual_seed(0)
    model = Net()
    recorder = Recorder()
    callbacks: list = [recorder]
    run_options: dict = {}
    stage = 2 if phase.startswith("zero2") or phase in ("config-optimizer", "bad-batch", "bad-accumulation") else 3
    options: dict = {"deepspeed_kwargs": {"zero_stage": stage}}
    if "lean" in phase:  # no parameter kept whole on every rank: each lives only in its partitions
        options["deepspeed_kwargs"]["config"] = {"zero_optimization": {"stage3_param_persistence_threshold": 0}}
    if phase.startswith("full"):  # gathered into one file by rank 0, not written as every rank's partitions
        options["deepspeed_kwargs"]["state_dict"] = "full"
    driver = "torch" if phase.startswith("ddp") else "torch_fsdp" if phase.startswith("fsdp") else "deepspeed"
    if driver != "deepspeed":
        options = {}
    if phase in ("interrupt", "ddp-interrupt", "lean-interrupt", "fsdp-interrupt", "zero2-interrupt", "bf16-interrupt",
                 "full-interrupt"):
        callbacks.append(StopAt(INTERRUPT_AT, os.path.join(args.out, phase.replace("interrupt", "interrupted"))))
    out = args.out
    resume = {"resume-same": f"{out}/interrupted", "zero2-resume": f"{out}/interrupted", "resume-other": args.other,
              "ddp-resume-other": args.other, "lean-resume-other": args.other, "lean-resume": f"{out}/lean-interrupted",
              "fsdp-resume-lean": f"{out}/lean-interrupted", "ddp-resume-lean": f"{out}/lean-interrupted",
              "lean-resume-fsdp": f"{out}/fsdp-interrupted", "ddp-resume-fsdp": f"{out}/fsdp-interrupted",
              "zero2-resume-own": f"{out}/zero2-interrupted", "lean-resume-zero2": f"{out}/zero2-interrupted",
              "ddp-resume-zero2": f"{out}/zero2-interrupted", "zero2-resume-other": args.other,
              "bf16-resume": f"{out}/bf16-interrupted", "full-resume": f"{out}/full-interrupted",
              "ddp-resume-full": f"{out}/full-interrupted", "fixed-resume-other": args.other}
    if phase in resume:
        run_options["resume_from"] = resume[phase]
    optimizer = True
    if phase == "config-optimizer":
        path = os.path.join(args.out, "ds_config.json")
        mine = f"{path}.{os.getpid()}"  # every rank writes the same file: whole, then renamed, so none reads half
        with open(mine, "w") as f:
            json.dump({"optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01, "torch_adam": True}},
                       "gradient_clipping": GRAD_CLIP, "train_micro_batch_size_per_gpu": BATCH_PER_RANK,
                       "gradient_accumulation_steps": ACCUMULATION, "zero_optimization": {"stage": 2}}, f)
        os.replace(mine, path)
        options = {"deepspeed_kwargs": {"config": path}, "grad_clip": None}
        optimizer = False
    if phase.startswith("bf16"):
        options["precision"] = "bf16"
    if phase.startswith("fixed"):
        options["deepspeed_kwargs"]["config"] = {"train_micro_batch_size_per_gpu": BATCH_PER_RANK}
    if phase == "bad-batch":
        options["deepspeed_kwargs"]["config"] = {"train_micro_batch_size_per_gpu": 16}
    if phase == "bad-accumulation":
        options["deepspeed_kwargs"]["config"] = {"gradient_accumulation_steps": 4}
    if phase == "kill":
        callbacks.append(WaitToBeKilled(args.out))
        options["deepspeed_kwargs"]["timeout"] = 20
    if args.nproc:
        options["nproc"] = args.nproc
    if phase == "existing-group":
        import torch.distributed as dist

        dist.init_process_group("gloo")
    result: dict = {}
    if phase == "load-other":
        trainer = build_trainer(model, driver=driver, callbacks=callbacks, **options)
        trainer.load_checkpoint(args.other, resume_training=False)
        d = trainer.driver
        with open(os.path.join(args.out, f"{phase}-rank{d.rank}.json"), "w") as f:
            json.dump({"driver": type(d).__name__, "params": state_lists(d.model_state())}, f)
        return
    try:
        trainer = build_trainer(model, driver=driver, callbacks=callbacks, evaluate=phase in EVALUATING,
                                optimizer=optimizer, **options)
        trainer.run(num_eval_sanity_batch=0, **run_options)
    except DriverError as exc:
        if not phase.startswith("bad-"):
            raise
        result["refused"] = str(exc)
        rank = int(os.environ.get("RANK", "0"))
        with open(os.path.join(args.out, f"{phase}-rank{rank}.json"), "w") as f:
            json.dump(result, f)
        return
    d = trainer.driver
    result.update(rank=d.rank, world_size=d.world_size, driver=type(d).__name__, describe=d.describe(),
                  params=state_lists(d.model_state()), seen=recorder.seen, history=trainer.history)
    if phase in EVALUATING:
        result["eval"] = trainer.evaluate()
        result["predict"] = {k: v.tolist() for k, v in trainer.predict(
            DataLoader(Points(N_EVAL, seed=1), batch_size=PREDICT_BATCH if phase.startswith("fixed") else EVAL_BATCH
                       )).items()}
    if phase == "zero3":
        trainer.save_model(os.path.join(args.out, "model"))
        result["loaded_forward_diff"] = loaded_forward_diff(d)
    with open(os.path.join(args.out, f"{phase}-rank{d.rank}.json"), "w") as f:
        json.dump(result, f)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("phases")
    parser.add_argument("--other")
    parser.add_argument("--nproc", type=int)
    parser.add_argument("--local_rank", type=int, help=argparse.SUPPRESS)  # the deepspeed launcher passes it
    args = parser.parse_args()
    for phase in args.phases.split(","):
        run_phase(phase, args)
    print(f"rank-done {os.environ.get('RANK', '0')}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
