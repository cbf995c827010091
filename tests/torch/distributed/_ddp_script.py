"""The program the distributed tests start (torchrun, or ``python _ddp_script.py`` for the Trainer's own spawn).

    _ddp_script.py train OUT PHASES [--nproc N] [--user-init] [--prefix] [--resume-from DIR] [--device 0,1]
    _ddp_script.py fail OUT MODE [--timeout S]
    _ddp_script.py ctrl-c OUT PHASES

``train`` runs the comma-separated PHASES one after another in the same processes
and writes ``OUT/<phase>-rank<r>.json`` per rank (final parameters, evaluation
results, the sample indices each rank trained on per epoch, callback counts):

- ``full``: the reference training (2 epochs, accumulation 2, ``train_step``) with an
  evaluation on an odd-sized set and a CheckpointCallback;
- ``interrupt``: the same training stopped after ``INTERRUPT_AT`` batches, with a
  checkpoint saved at that point into ``OUT/interrupted``;
- ``resume``: the same training resumed from ``--resume-from`` (another world size's checkpoint).
- ``resume-same``: resumed from ``OUT/interrupted`` (same world size).

``fail`` trains slowly and misbehaves on rank 1 (or 0) at batch ``FAIL_AT``:
``raise`` raises, ``stall`` sleeps forever, ``mark`` only marks the batch (so that the test can kill a
rank mid-epoch), ``early`` makes rank 1 exit with code 3 before it builds the Trainer. Every rank writes
``OUT/pid-rank<r>`` at the start and ``OUT/at-rank<r>`` when it reaches ``FAIL_AT``.

``ctrl-c`` runs the phases of ``tests/_ctrl_c_rule.py`` (Ctrl-C, then resume) on the same run without accumulation.

Everything before the ``Trainer(...)`` runs in every process, as the docs say it will.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

from drivetrain import (  # noqa: E402
    Accuracy,
    Callback,
    CheckpointCallback,
    EarlyStopException,
    Event,
    Trainer,
    rank_zero_only,
)

torch.set_num_threads(1)

N_TRAIN, N_EVAL = 48, 37
BATCH_PER_RANK, EVAL_BATCH = 4, 3
N_EPOCHS, ACCUMULATION = 2, 2
INTERRUPT_AT = 3
FAIL_AT = 3


class Points(Dataset):
    def __init__(self, n: int, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 4, generator=gen)
        self.target = ((self.x[:, 0] > 0).long() + (self.x[:, 1] > 0.5).long())

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict:
        return {"x": self.x[i], "target": self.target[i], "idx": i}


class Net(torch.nn.Module):
    """An MLP with a buffer (DDP would broadcast it in its forward) and a train_step method."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 16)
        self.fc2 = torch.nn.Linear(16, 3)
        self.register_buffer("scale", torch.ones(()))

    def forward(self, x: torch.Tensor, target: torch.Tensor | None = None) -> dict:
        pred = self.fc2(torch.relu(self.fc1(x))) * self.scale
        out = {"pred": pred}
        if target is not None:
            out["loss"] = torch.nn.functional.cross_entropy(pred, target)
        return out

    def train_step(self, x: torch.Tensor, target: torch.Tensor) -> dict:
        return self(x, target)


class Recorder(Callback):
    """What this rank saw: sample indices per epoch and how often some events fired."""

    def __init__(self) -> None:
        self.seen: dict[str, list[int]] = {}
        self.counts = {"on_train_epoch_end": 0, "on_evaluate_end": 0}

    def on_train_batch_begin(self, trainer, batch, indices) -> None:
        self.seen.setdefault(str(trainer.cur_epoch_idx), []).extend(batch["idx"].tolist())

    def on_train_epoch_end(self, trainer) -> None:
        self.counts["on_train_epoch_end"] += 1

    def on_evaluate_end(self, trainer, results) -> None:
        self.counts["on_evaluate_end"] += 1


class StopAt(Callback):
    """Save a checkpoint after ``at`` batches, then stop (the interrupted half of a resume test)."""

    def __init__(self, at: int, folder: str) -> None:
        self.at, self.folder = at, folder

    def on_train_batch_end(self, trainer) -> None:
        if trainer.global_forward_batches == self.at:
            trainer.save_checkpoint(self.folder)
            raise EarlyStopException("interrupted on purpose")


def build_trainer(model, *, batch_size: int, callbacks: list, evaluate: bool = False, **options) -> Trainer:
    """The run every phase and the in-process references share (only the batch size and launch differ)."""
    train = DataLoader(Points(N_TRAIN, seed=0), batch_size=batch_size, shuffle=True)
    extra = {"evaluate_dataloaders": DataLoader(Points(N_EVAL, seed=1), batch_size=EVAL_BATCH),
             "metrics": {"acc": Accuracy()}} if evaluate else {}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    options.setdefault("accumulation_steps", ACCUMULATION)
    options.setdefault("n_epochs", N_EPOCHS)
    return Trainer(model, train, optimizer, driver="torch", callbacks=callbacks,
                   progress_bar=None, **extra, **options)


def params_of(model: torch.nn.Module) -> dict[str, list[float]]:
    return {name: p.detach().flatten().tolist() for name, p in model.named_parameters()}


# ------------------------------------------------------------------------------ train
def run_phase(phase: str, args: argparse.Namespace, launch: dict) -> None:
    torch.manual_seed(0)
    model = Net()
    trainable = model
    if args.user_init:
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group("gloo")
        trainable = torch.nn.parallel.DistributedDataParallel(model)
    recorder = Recorder()
    zero_calls = []
    callbacks: list = [recorder]
    run_options: dict = {}
    if phase == "full":
        callbacks.append(CheckpointCallback(os.path.join(args.out, "ckpt-full"), every_n_epochs=1, save_last=False))
    elif phase == "interrupt":
        callbacks.append(StopAt(INTERRUPT_AT, os.path.join(args.out, "interrupted")))
    elif phase in ("resume", "resume-same"):
        run_options["resume_from"] = args.resume_from if phase == "resume" else os.path.join(args.out, "interrupted")
    records = {"loggers": ["jsonl"], "log_every_n_steps": 3, "run_dir": os.path.join(args.out, "record")} \
        if phase == "full" else {}
    trainer = build_trainer(trainable, batch_size=BATCH_PER_RANK, callbacks=callbacks, evaluate=phase == "full",
                            **launch, **records)
    trainer.add_callback_fn(Event.on_train_end(), rank_zero_only(lambda t: zero_calls.append(1)))
    trainer.run(num_eval_sanity_batch=0, **run_options)
    driver = trainer.driver
    result = {
        "rank": driver.rank, "world_size": driver.world_size, "driver": type(driver).__name__,
        "params": params_of(model), "seen": recorder.seen, "counts": recorder.counts, "zero_only": len(zero_calls),
        "pid": os.getpid(), "history": trainer.history,
    }
    if phase == "full":
        result["eval"] = trainer.evaluate()
        unwrapped = driver.unwrap_model()
        with torch.no_grad():
            data = Points(N_EVAL, seed=1)
            result["eval_by_hand"] = (unwrapped(data.x)["pred"].argmax(-1) == data.target).float().mean().item()
            result["pred_by_hand"] = unwrapped(data.x)["pred"].tolist()
        # prediction: every rank predicts its shard; each gets the whole set back, in dataset order
        predicted = trainer.predict(DataLoader(Points(N_EVAL, seed=1), batch_size=EVAL_BATCH))
        unwrapped = driver.unwrap_model()
        predicted["idx"] = trainer.predict(DataLoader(Points(N_EVAL, seed=1), batch_size=EVAL_BATCH),
                                           predict_fn=lambda x, idx: {"idx": idx})["idx"]
        streamed = trainer.predict(DataLoader(Points(N_EVAL, seed=1), batch_size=EVAL_BATCH),
                                   save_to=os.path.join(args.out, "predictions"))
        result["predict"] = {k: v.tolist() for k, v in predicted.items()}
        result["streamed_equal"] = bool((streamed["pred"] == predicted["pred"]).all())
    with open(os.path.join(args.out, f"{phase}-rank{driver.rank}.json"), "w") as f:
        json.dump(result, f)


def train(args: argparse.Namespace) -> None:
    launch: dict = {}
    if args.nproc:
        launch["nproc"] = args.nproc
    if args.prefix:
        launch["torch_kwargs"] = {"spawn_output": "prefix"}
    if args.device:
        launch["device"] = [int(i) for i in args.device.split(",")]
    for phase in args.phases.split(","):
        run_phase(phase, args, launch)
        launch.pop("torch_kwargs", None)  # later phases reuse the process group: no start-up options
    print(f"rank-done {os.environ.get('RANK', '0')}", flush=True)


# ------------------------------------------------------------------------------- fail
class Misbehave(Callback):
    def __init__(self, out: str, mode: str, victim: int) -> None:
        self.out, self.mode, self.victim = out, mode, victim

    def on_train_batch_begin(self, trainer, batch, indices) -> None:
        rank = trainer.driver.rank
        time.sleep(0.05)  # stands in for compute, so a kill lands mid-epoch
        if trainer.global_forward_batches != FAIL_AT:
            return
        with open(os.path.join(self.out, f"at-rank{rank}"), "w") as f:
            f.write(str(time.time()))
        if rank != self.victim:
            return
        if self.mode == "raise":
            raise ValueError(f"boom on purpose at batch {FAIL_AT}")
        if self.mode == "stall":
            time.sleep(3600)


def fail(args: argparse.Namespace) -> None:
    rank = os.environ.get("RANK", "0")
    with open(os.path.join(args.out, f"pid-rank{rank}"), "w") as f:
        f.write(str(os.getpid()))
    if args.mode == "early" and rank == "1":
        sys.exit(3)  # dies before reaching Trainer(...)
    torch.manual_seed(0)
    model = Net()
    options = {"nproc": 2, "torch_kwargs": {"timeout": args.timeout}}
    trainer = Trainer(model, DataLoader(Points(400, seed=0), batch_size=2, shuffle=True),
                      torch.optim.SGD(model.parameters(), lr=0.1), driver="torch", n_epochs=1, progress_bar=None,
                      callbacks=[Misbehave(args.out, args.mode, args.victim)], **options)
    trainer.run()


# ----------------------------------------------------------------------------- ctrl-c
def ctrl_c(args: argparse.Namespace) -> None:
    """The phases of ``tests/_ctrl_c_rule.py`` on this script's run, without accumulation."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
    from tests._ctrl_c_rule import run_phase

    def make_trainer(n_epochs: int, callbacks: list, **options) -> Trainer:
        torch.manual_seed(0)
        return build_trainer(Net(), batch_size=BATCH_PER_RANK, callbacks=callbacks, accumulation_steps=1,
                             n_epochs=n_epochs, **options)

    for phase in args.phases.split(","):
        run_phase(phase, args.out, make_trainer)


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train")
    t.add_argument("out")
    t.add_argument("phases")
    t.add_argument("--nproc", type=int)
    t.add_argument("--user-init", action="store_true")
    t.add_argument("--prefix", action="store_true")
    t.add_argument("--resume-from")
    t.add_argument("--device", help="comma-separated GPU indices, e.g. 0,1")
    f = sub.add_parser("fail")
    f.add_argument("out")
    f.add_argument("mode", choices=("raise", "stall", "mark", "early"))
    f.add_argument("--victim", type=int, default=1)
    f.add_argument("--timeout", type=float, default=60.0)
    c = sub.add_parser("ctrl-c")
    c.add_argument("out")
    c.add_argument("phases")
    args = parser.parse_args()
    {"train": train, "fail": fail, "ctrl-c": ctrl_c}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
