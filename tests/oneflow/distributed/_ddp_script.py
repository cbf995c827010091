"""The program the distributed oneflow tests start.

    python -m oneflow.distributed.launch --nproc_per_node 2 --master_port P _ddp_script.py train OUT
    python _ddp_script.py train OUT --nproc 2          (the Trainer starts and supervises the workers)
    python -m oneflow.distributed.launch ... _ddp_script.py fail OUT MODE [--timeout S]

``train`` runs the reference training (2 epochs, accumulation 2, ``train_step``,
4 samples per rank per batch), evaluates on an odd-sized set, exercises the object
collectives and saves a checkpoint; each rank writes ``OUT/train-rank<r>.json``.

``interrupt`` runs the same training and saves a checkpoint after batch ``INTERRUPT_AT``
(inside an accumulation cycle) into ``OUT/interrupted``; ``resume`` resumes from it and
writes ``OUT/resume-rank<r>.json``.

``fail`` trains slowly and misbehaves on rank 1 at batch ``FAIL_AT``: ``raise`` raises,
``kill`` sends itself SIGKILL, ``stall`` sleeps forever (outside any driver call).
Every rank writes ``OUT/pid-rank<r>`` at the start and ``OUT/at-rank<r>`` at batch ``FAIL_AT``.

Everything before ``Trainer(...)`` runs in every process (and, with ``--nproc``, in the
supervisor too), as the docs say it will.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("GLOG_minloglevel", "2")

import numpy as np  # noqa: E402
import oneflow as flow  # noqa: E402

from drivetrain import Accuracy, Event, Trainer  # noqa: E402

N_TRAIN, N_EVAL = 48, 37
BATCH_PER_RANK, EVAL_BATCH = 4, 3
N_EPOCHS, ACCUMULATION = 2, 2
FAIL_AT = 3
INTERRUPT_AT = 3


class Points(flow.utils.data.Dataset):
    def __init__(self, n: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.x = rng.standard_normal((n, 4)).astype(np.float32)
        self.target = ((self.x[:, 0] > 0).astype(np.int64) + (self.x[:, 1] > 0.5).astype(np.int64))

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict:
        return {"x": self.x[i], "target": self.target[i], "idx": np.int64(i)}


class Net(flow.nn.Module):
    """An MLP with a train_step method (DDP must still synchronise its gradients)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = flow.nn.Linear(4, 16)
        self.fc2 = flow.nn.Linear(16, 3)
        rng = np.random.default_rng(0)
        with flow.no_grad():
            for p in self.parameters():
                p.copy_(flow.tensor(rng.standard_normal(tuple(p.shape)).astype(np.float32) * 0.5))
        self.seen: list[int] = []

    def forward(self, x, target=None):
        pred = self.fc2(flow.relu(self.fc1(x)))
        out = {"pred": pred}
        if target is not None:
            out["loss"] = flow.nn.functional.cross_entropy(pred, target)
        return out

    def train_step(self, x, target, idx):
        self.seen.extend(int(i) for i in idx.numpy())
        return dict(self.forward(x, target), samples=len(idx))  # a non-tensor output DDP's hook cannot take


def build_trainer(model: Net, batch_size: int, nproc: int | None = None, evaluate: bool = True,
                  options: dict | None = None, n_epochs: int = N_EPOCHS) -> Trainer:
    seed_loader = flow.Generator()
    seed_loader.manual_seed(5)
    loader = flow.utils.data.DataLoader(Points(N_TRAIN, 0), batch_size=batch_size, shuffle=True,
                                        generator=seed_loader)
    dev = flow.utils.data.DataLoader(Points(N_EVAL, 1), batch_size=EVAL_BATCH) if evaluate else None
    return Trainer(model, loader, flow.optim.SGD(model.parameters(), lr=0.3), driver="oneflow", device="cpu",
                   nproc=nproc, n_epochs=n_epochs, accumulation_steps=ACCUMULATION, evaluate_dataloaders=dev,
                   metrics={"acc": Accuracy()} if evaluate else None, progress_bar=None,
                   oneflow_kwargs=options or None)


def params(model: Net) -> dict[str, list[float]]:
    return {k: v.numpy().ravel().tolist() for k, v in model.state_dict().items()}


def train(out: str, nproc: int | None) -> None:
    model = Net()
    trainer = build_trainer(model, BATCH_PER_RANK, nproc)
    driver = trainer.driver
    trainer.run(num_eval_sanity_batch=0)
    results = trainer.evaluate()
    trainer.save_checkpoint(os.path.join(out, "checkpoint"))
    rank = driver.rank
    # prediction: each rank predicts its shard; every rank gets the whole set back in dataset order
    dev = flow.utils.data.DataLoader(Points(N_EVAL, 1), batch_size=EVAL_BATCH)
    predicted = trainer.predict(dev, predict_fn=lambda x, idx: {"pred": driver.unwrap_model()(x)["pred"], "idx": idx})
    report = {
        "rank": rank, "world_size": driver.world_size, "distributed": driver.is_distributed(),
        "params": params(model), "eval": results, "seen": model.seen,
        "predicted": predicted["pred"].tolist(), "predicted_idx": predicted["idx"].tolist(),
        "gathered": driver.all_gather_object({"rank": rank, "text": "x" * (rank * 100)}),
        "broadcast": driver.broadcast_object(["from", rank], src=1),
        "max": driver.all_reduce(np.array([rank, -rank], np.int64), "max").tolist(),
        "sum": driver.all_reduce(np.array([0.5 + rank]), "sum").tolist(),
    }
    with open(os.path.join(out, f"train-rank{rank}.json"), "w") as f:
        json.dump(report, f)


def interrupt(out: str) -> None:
    trainer = build_trainer(Net(), BATCH_PER_RANK, evaluate=False)
    folder = os.path.join(out, "interrupted")
    trainer.add_callback_fn(Event.on_train_batch_end(), lambda t: t.save_checkpoint(folder)
                            if t.global_forward_batches == INTERRUPT_AT else None)
    trainer.run(num_eval_sanity_batch=0)


def resume(out: str) -> None:
    model = Net()
    trainer = build_trainer(model, BATCH_PER_RANK, evaluate=False)
    trainer.run(resume_from=os.path.join(out, "interrupted"), num_eval_sanity_batch=0)
    with open(os.path.join(out, f"resume-rank{trainer.driver.rank}.json"), "w") as f:
        json.dump({"params": params(model), "batches": trainer.global_forward_batches}, f)


def fail(out: str, mode: str, timeout: float, nproc: int | None) -> None:
    rank = os.environ.get("RANK", "supervisor")  # with --nproc, this process starts the workers
    with open(os.path.join(out, f"pid-rank{rank}"), "w") as f:
        f.write(str(os.getpid()))
    model = Net()
    trainer = build_trainer(model, BATCH_PER_RANK, nproc, evaluate=False, options={"timeout": timeout}, n_epochs=50)

    def misbehave(t) -> None:
        time.sleep(0.05)
        if t.global_forward_batches != FAIL_AT:
            return
        with open(os.path.join(out, f"at-rank{t.driver.rank}"), "w") as f:
            f.write(str(time.time()))
        if t.driver.rank != 1:
            return
        if mode == "raise":
            raise RuntimeError("rank 1 fails on purpose")
        if mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if mode == "stall":
            time.sleep(3600)

    trainer.add_callback_fn(Event.on_train_batch_end(), misbehave)
    trainer.run(num_eval_sanity_batch=0)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=["train", "interrupt", "resume", "fail"])
    parser.add_argument("out")
    parser.add_argument("mode", nargs="?", default="raise")
    parser.add_argument("--nproc", type=int, default=None)
    parser.add_argument("--timeout", type=float, default=60.0)
    args = parser.parse_args(argv)
    if args.what == "train":
        train(args.out, args.nproc)
    elif args.what == "interrupt":
        interrupt(args.out)
    elif args.what == "resume":
        resume(args.out)
    else:
        fail(args.out, args.mode, args.timeout, args.nproc)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
