"""The program the FSDP tests start under torchrun (2 ranks, or 1 or 3, gloo on CPU).

    _fsdp_script.py OUT PHASES [--one-process DIR] [--nproc 2] [--source DIR] [--accumulation N]

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
- ``mid-cycle``: a checkpoint asked for inside an accumulation cycle, refused (the message is recorded);
- ``full-state``: ``interrupt`` with ``state_dict='full'`` (gathered to rank 0, one model file), into
  ``OUT/interrupted-full``;
- ``resume-source``: FSDP resumed from ``--source`` (a checkpoint of any world size);
- ``reshard``: at any world size W, ``load_checkpoint(--source, resume_training=False)`` (weights and
  optimizer state only), recorded, then saved again as ``OUT/from-W`` (W shard files).

- ``save-fails``: a sharded checkpoint saved as ``OUT/kept``, then saved again under that name with
  rank 1's disk "full" (its file write raises ENOSPC): every rank must raise naming rank 1, and
  ``OUT/kept`` must still be the first checkpoint (the errors and its manifest time are recorded).

- ``meta``: the model built on the meta device (each rank allocates only its shards, initialised by
  ``reset_parameters``; recorded as ``initialised``), then ``load_model`` of the seed-0 weights as a plain
  safetensors file (each rank reads its slices), then the ``full`` run (no evaluation).

Every phase also records the full optimizer state (``optim``), except ``ctrl-c``, ``resume`` and ``straight``:
those are ``tests/_ctrl_c_rule.py``'s (Ctrl-C, then resume), on the same run without accumulation.

With ``--nproc 2`` the script is started as ``python _fsdp_script.py`` and the Trainer starts rank 1.
``--accumulation N`` sets ``accumulation_steps`` (default ``ACCUMULATION``): one rank accumulating 4
batches steps on the samples two ranks accumulating 2 do.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

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
    options = {"accumulation_steps": ACCUMULATION, "n_epochs": N_EPOCHS, "log_every_n_steps": 2, **options}
    return Trainer(model, train, optimizer, driver=driver, grad_clip=GRAD_CLIP, callbacks=callbacks,
                   progress_bar=None, **extra, **options)


def state_lists(state: dict) -> dict[str, list[float]]:
    return {name: t.detach().float().flatten().tolist() for name, t in sorted(state.items())}


def ctrl_c_phase(phase: str, args: argparse.Namespace) -> None:
    """A phase of ``tests/_ctrl_c_rule.py`` (Ctrl-C, then resume) on this script's run, without accumulation."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
    from tests._ctrl_c_rule import run_phase as run_rule_phase

    def make_trainer(n_epochs: int, callbacks: list, **options) -> Trainer:
        torch.manual_seed(0)
        return build_trainer(Net(), batch_size=BATCH_PER_RANK, driver="torch_fsdp", callbacks=callbacks,
                             accumulation_steps=1, n_epochs=n_epochs, **options)

    run_rule_phase(phase, args.out, make_trainer)


def run_phase(phase: str, args: argparse.Namespace) -> None:
    if phase in ("ctrl-c", "resume", "straight"):
        ctrl_c_phase(phase, args)
        return
    torch.manual_seed(0)
    model = Net()
    initial_file = os.path.join(args.out, "initial.safetensors")
    if phase == "meta":
        if int(os.environ.get("RANK", "0")) == 0:
            from safetensors.torch import save_file

            save_file(model.state_dict(), initial_file + ".tmp")
            os.replace(initial_file + ".tmp", initial_file)
        with torch.device("meta"):
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
              "ddp-from-fsdp": os.path.join(args.out, "interrupted"), "resume-source": args.source}
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
    if phase == "full-state":
        callbacks.append(StopAt(INTERRUPT_AT, os.path.join(args.out, "interrupted-full")))
        options["torch_fsdp_kwargs"] = {"state_dict": "full"}
    if args.nproc:
        options["nproc"] = args.nproc
    if args.accumulation:
        options["accumulation_steps"] = args.accumulation
    trainer = build_trainer(model, batch_size=BATCH_PER_RANK, driver=driver, callbacks=callbacks,
                            evaluate=phase == "full", **options)
    initialised = None
    if phase == "meta":
        initialised = state_lists(trainer.driver.model_state())
        while not os.path.exists(initial_file):  # rank 0 writes it; the ranks meet in the next collective
            time.sleep(0.05)
        trainer.load_model(initial_file)
    if phase == "save-fails":
        write_result(trainer, phase, args.out, recorder, save=False)
        save_fails(trainer, os.path.join(args.out, "kept"), os.path.join(args.out, f"{phase}-rank{trainer.driver.rank}.json"))
        return
    if phase == "reshard":
        trainer.load_checkpoint(args.source, resume_training=False)
        write_result(trainer, phase, args.out, recorder)
        trainer.save_checkpoint(os.path.join(args.out, f"from-{trainer.driver.world_size}"))
        return
    try:
        trainer.run(num_eval_sanity_batch=0, **run_options)
    except Exception as exc:  # the callback's DriverError, wrapped in a CallbackError
        if phase != "mid-cycle" or not isinstance(exc.__cause__, DriverError):
            raise
        run_options["refused"] = str(exc.__cause__)
    result = write_result(trainer, phase, args.out, recorder, save=False)
    result["initialised"] = initialised
    d = trainer.driver
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


def write_result(trainer: Trainer, phase: str, out: str, recorder: Recorder, save: bool = True) -> dict:
    """What every phase records (every rank calls it: reading a sharded state gathers it)."""
    d = trainer.driver
    result = {"rank": d.rank, "world_size": d.world_size, "driver": type(d).__name__,
              "params": state_lists(d.model_state()), "optim": optimizer_lists(d.optimizer_states()),
              "seen": recorder.seen, "history": trainer.history}
    if save:
        with open(os.path.join(out, f"{phase}-rank{d.rank}.json"), "w") as f:
            json.dump(result, f)
    return result


def save_fails(trainer: Trainer, folder: str, out: str) -> None:
    """Save, then save again while rank 1 cannot write; record what each rank saw."""
    from drivetrain._checkpoint import sharded

    trainer.save_checkpoint(folder)
    created = json.load(open(os.path.join(folder, "manifest.json")))["created"]
    if trainer.driver.rank == 1:
        def disk_full(*args, **kwargs):
            raise OSError(28, "No space left on device")

        sharded._write_files = disk_full
    try:
        trainer.save_checkpoint(folder)
        error = None
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    after = json.load(open(os.path.join(folder, "manifest.json")))["created"]
    leftovers = [n for n in os.listdir(os.path.dirname(folder)) if n.startswith(".tmp-")]
    with open(out, "w") as f:
        json.dump({"error": error, "unchanged": after == created, "leftovers": leftovers}, f)


def optimizer_lists(states: list) -> list:
    """Optimizer states as JSON: tensors as lists, keys as strings."""
    return [{"state": {str(i): {k: v.float().flatten().tolist() if isinstance(v, torch.Tensor) else v
                                for k, v in entry.items()} for i, entry in s["state"].items()},
             "param_groups": s["param_groups"]} for s in states]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("phases")
    parser.add_argument("--one-process")
    parser.add_argument("--nproc", type=int)
    parser.add_argument("--source")
    parser.add_argument("--accumulation", type=int)
    args = parser.parse_args()
    for phase in args.phases.split(","):
        run_phase(phase, args)
    print(f"rank-done {os.environ.get('RANK', '0')}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
