"""The program the FSDP tests start under torchrun (2 ranks, gloo on CPU).

    _fsdp_script.py OUT PHASES [--one-process DIR] [--nproc 2]

Runs the comma-separated PHASES one after another in the same processes (the first
Trainer starts the process group, the later ones use it) and writes
``OUT/<phase>-rank<r>.json`` per rank: the full model state, the history, the samples seen.

- ``full``: ``driver="torch_fsdp"``, 2 epochs, accumulation 2, clipping by norm, evaluation on
  an odd-sized set each epoch, then evaluate() and predict();
- ``interrupt``: the same, stopped after ``INTERRUPT_AT`` batches (a cycle boundary) with a
  checkpoint in ``OUT/interrupted``;
- ``resume-same``: FSDP resumed from ``OUT/interrupted``;
- ``resume-one``: FSDP resumed from ``--one-process`` (a one-process ``driver="torch"`` checkpoint);
- ``ddp-interrupt``: ``driver="torch"`` (DDP) interrupted like ``interrupt``, into ``OUT/ddp-interrupted``;
- ``resume-from-ddp``: FSDP resumed from ``OUT/ddp-interrupted``;
- ``ddp-from-fsdp``: DDP resumed from ``OUT/interrupted``;
- ``options``: bf16 parameters, explicit ``wrap`` and activation checkpointing, no accumulation;
- ``fp16``: fp16 with its loss scaler, an inf put into rank 0's gradient shard only at the first step:
  every rank must skip that step and halve the scale;
- ``mid-cycle``: a checkpoint asked for inside an accumulation cycle, refused (the message is recorded).

With ``--nproc 2`` the script is started as ``python _fsdp_script.py`` and the Trainer starts rank 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from drivetrain import Accuracy, Callback, DriverError, EarlyStopException, Trainer  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # torchrun runs this file by path
from _ddp_script import Points  # noqa: E402  (the DDP test's data, so both runs train on the same samples)

torch.set_num_threads(1)

N_TRAIN, N_EVAL = 48, 37
BATCH_PER_RANK, EVAL_BATCH = 4, 3
N_EPOCHS, ACCUMULATION = 2, 2
INTERRUPT_AT = 4
GRAD_CLIP = 0.5


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.fc(x))


class Net(torch.nn.Module):
    """Two residual blocks in a ModuleList (the default rule shards each), and a train_step method."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Linear(4, 16)
        self.blocks = torch.nn.ModuleList([Block(), Block()])
        self.head = torch.nn.Linear(16, 3)

    def forward(self, x: torch.Tensor, target: torch.Tensor | None = None) -> dict:
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        out = {"pred": self.head(h)}
        if target is not None:
            out["loss"] = torch.nn.functional.cross_entropy(out["pred"].float(), target)
        return out

    def train_step(self, x: torch.Tensor, target: torch.Tensor) -> dict:
        return self(x, target)


class Recorder(Callback):
    def __init__(self) -> None:
        self.seen: dict[str, list[int]] = {}

    def on_train_batch_begin(self, trainer, batch, indices) -> None:
        self.seen.setdefault(str(trainer.cur_epoch_idx), []).extend(batch["idx"].tolist())


class StopAt(Callback):
    def __init__(self, at: int, folder: str) -> None:
        self.at, self.folder = at, folder

    def on_train_batch_end(self, trainer) -> None:
        if trainer.global_forward_batches == self.at:
            trainer.save_checkpoint(self.folder)
            raise EarlyStopException("interrupted on purpose")


class InfOnRankZero(Callback):
    """An inf in rank 0's shard of the first step's gradients; records the scale after each step."""

    def __init__(self) -> None:
        self.scales: list[float] = []
        self.after_first: dict = {}

    def on_after_backward(self, trainer) -> None:
        if trainer.global_forward_batches == 0 and trainer.driver.rank == 0:
            grad = dict(trainer.driver.model.named_parameters())["head.weight"].grad
            grad.to_local()[0, 0] = float("inf")

    def on_train_batch_end(self, trainer) -> None:
        self.scales.append(trainer.driver.grad_scaler.get_scale())
        if trainer.global_forward_batches == 1:
            self.after_first = state_lists(trainer.driver.model_state())  # every rank: it gathers


def build_trainer(model, *, batch_size: int, driver: str, callbacks: list, evaluate: bool = False,
                  **options) -> Trainer:
    """The run every phase and the one-process references share."""
    train = DataLoader(Points(N_TRAIN, seed=0), batch_size=batch_size, shuffle=True)
    extra = {"evaluate_dataloaders": DataLoader(Points(N_EVAL, seed=1), batch_size=EVAL_BATCH),
             "metrics": {"acc": Accuracy()}} if evaluate else {}
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    options.setdefault("accumulation_steps", ACCUMULATION)
    return Trainer(model, train, optimizer, driver=driver, n_epochs=N_EPOCHS, grad_clip=GRAD_CLIP,
                   callbacks=callbacks, progress_bar=None, log_every_n_steps=2, **extra, **options)


def state_lists(state: dict) -> dict[str, list[float]]:
    return {name: t.detach().float().flatten().tolist() for name, t in sorted(state.items())}


def run_phase(phase: str, args: argparse.Namespace) -> None:
    torch.manual_seed(0)
    model = Net()
    recorder = Recorder()
    callbacks: list = [recorder]
    run_options: dict = {}
    driver = "torch" if phase.startswith("ddp-") else "torch_fsdp"
    options: dict = {}
    if phase in ("interrupt", "ddp-interrupt"):
        folder = "interrupted" if phase == "interrupt" else "ddp-interrupted"
        callbacks.append(StopAt(INTERRUPT_AT, os.path.join(args.out, folder)))
    resume = {"resume-same": os.path.join(args.out, "interrupted"), "resume-one": args.one_process,
              "resume-from-ddp": os.path.join(args.out, "ddp-interrupted"),
              "ddp-from-fsdp": os.path.join(args.out, "interrupted")}
    if phase in resume:
        run_options["resume_from"] = resume[phase]
    if phase == "options":
        options = {"precision": "bf16", "accumulation_steps": 1, "torch_fsdp_kwargs": {
            "wrap": ["Block"], "activation_checkpointing": True}}
    if phase == "fp16":
        callbacks.append(InfOnRankZero())
        options = {"precision": "fp16", "accumulation_steps": 1, "n_batches": 2}
        initial = state_lists(model.state_dict())
    if phase == "mid-cycle":
        callbacks.append(StopAt(INTERRUPT_AT - 1, os.path.join(args.out, "mid-cycle")))
    if args.nproc:
        options["nproc"] = args.nproc
    trainer = build_trainer(model, batch_size=BATCH_PER_RANK, driver=driver, callbacks=callbacks,
                            evaluate=phase == "full", **options)
    try:
        trainer.run(num_eval_sanity_batch=0, **run_options)
    except Exception as exc:  # the callback's DriverError, wrapped in a CallbackError
        if phase != "mid-cycle" or not isinstance(exc.__cause__, DriverError):
            raise
        run_options["refused"] = str(exc.__cause__)
    d = trainer.driver
    result = {"rank": d.rank, "world_size": d.world_size, "driver": type(d).__name__,
              "params": state_lists(d.model_state()), "seen": recorder.seen, "history": trainer.history}
    if phase == "mid-cycle":
        result["refused"] = run_options.get("refused")
    if phase == "fp16":
        inf = callbacks[-1]
        result.update(scales=inf.scales, initial=initial, after_first=inf.after_first)
    if phase == "full":
        result["eval"] = trainer.evaluate()
        result["predict"] = {k: v.tolist() for k, v in trainer.predict(
            DataLoader(Points(N_EVAL, seed=1), batch_size=EVAL_BATCH)).items()}
        trainer.save_model(os.path.join(args.out, "model"))
    with open(os.path.join(args.out, f"{phase}-rank{d.rank}.json"), "w") as f:
        json.dump(result, f)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("phases")
    parser.add_argument("--one-process")
    parser.add_argument("--nproc", type=int)
    args = parser.parse_args()
    for phase in args.phases.split(","):
        run_phase(phase, args)
    print(f"rank-done {os.environ.get('RANK', '0')}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
