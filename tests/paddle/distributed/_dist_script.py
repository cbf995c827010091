"""The program the distributed paddle tests start (paddle's launcher, ``python _dist_script.py`` for the
Trainer's own spawn, or two processes given paddle's variables by the test).

    _dist_script.py train OUT PHASES [--nproc N] [--user-init] [--fleet] [--prefix] [--resume-from DIR] [--overlap on|off]
                    [--slow SECONDS]
    _dist_script.py fail OUT MODE [--timeout S] [--victim R] [--overlap on|off]

``train`` runs the comma-separated PHASES one after another in the same processes
and writes ``OUT/<phase>-rank<r>.json`` per rank (final parameters, evaluation
results, the sample indices each rank trained on per epoch, callback counts, whether each backward ran with
DataParallel's reducer armed); ``--overlap`` sets ``paddle_kwargs['overlap']``:

- ``full``: the reference training (2 epochs, accumulation 2, ``train_step``) with an
  evaluation on an odd-sized set and a CheckpointCallback;
- ``interrupt``: the same training stopped after ``INTERRUPT_AT`` batches, with a
  checkpoint saved at that point into ``OUT/interrupted``;
- ``resume``: the same training resumed from ``--resume-from`` (another world size's checkpoint);
- ``resume-same``: resumed from ``OUT/interrupted`` (same world size);
- ``unused``: a model whose second layer only rank 1 uses, trained without and then with
  ``find_unused_parameters``;
- ``slurm``: the reference training with a CheckpointCallback every 2 batches in ``OUT/ckpt``, jsonl records in
  ``OUT/run-<tag>`` and ``resume_from="latest"``, written to ``OUT/slurm<tag>-rank<r>.json`` (``tag``: the
  Slurm job's restart count, or ``nproc``); ``--slow`` sleeps after each batch and rank 0 writes
  ``OUT/started`` after batch 2 (time for a preemption signal to arrive mid-run).

``fail`` trains slowly and misbehaves on rank 1 (or 0) at batch ``FAIL_AT``:
``raise`` raises, ``stall`` sleeps forever, ``mark`` only marks the batch (so that the test can kill a
rank mid-epoch), ``early`` makes rank 1 exit with code 3 before it builds the Trainer. Every rank writes
``OUT/pid-rank<r>`` at the start and ``OUT/at-rank<r>`` when it reaches ``FAIL_AT``.

Everything before the ``Trainer(...)`` runs in every process, as the docs say it will.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("GLOG_minloglevel", "2")

import numpy as np  # noqa: E402

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # paddle warns at import when no ccache is installed
    import paddle  # noqa: E402
from paddle.io import DataLoader, Dataset  # noqa: E402

from drivetrain import (  # noqa: E402
    Accuracy,
    Callback,
    CheckpointCallback,
    EarlyStopException,
    Event,
    Trainer,
    rank_zero_only,
)

N_TRAIN, N_EVAL = 48, 37
BATCH_PER_RANK, EVAL_BATCH = 4, 3
N_EPOCHS, ACCUMULATION = 2, 2
INTERRUPT_AT = 3
FAIL_AT = 3


class Points(Dataset):
    """Numpy samples (paddle's DataLoader turns them into tensors): features, a class and the index."""

    def __init__(self, n: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.x = rng.standard_normal((n, 4)).astype(np.float32)
        self.target = ((self.x[:, 0] > 0).astype(np.int64) + (self.x[:, 1] > 0.5).astype(np.int64))

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict:
        return {"x": self.x[i], "target": self.target[i], "idx": np.int64(i)}


class Net(paddle.nn.Layer):
    """An MLP with a buffer and a train_step method."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = paddle.nn.Linear(4, 16)
        self.fc2 = paddle.nn.Linear(16, 3)
        self.register_buffer("scale", paddle.ones([]))

    def forward(self, x, target=None) -> dict:
        pred = self.fc2(paddle.nn.functional.relu(self.fc1(x))) * self.scale
        out = {"pred": pred}
        if target is not None:
            out["loss"] = paddle.nn.functional.cross_entropy(pred, target)
        return out

    def train_step(self, x, target) -> dict:
        return self(x, target)


def make_net() -> Net:
    paddle.seed(0)
    return Net()


class Recorder(Callback):
    """What this rank saw: sample indices per epoch and how often some events fired."""

    def __init__(self) -> None:
        self.seen: dict[str, list[int]] = {}
        self.counts = {"on_train_epoch_end": 0, "on_evaluate_end": 0}
        self.synced: list[bool] = []
        self.began = -1

    def on_train_begin(self, trainer) -> None:
        self.began = trainer.global_forward_batches  # after a resume: where the run continues

    def on_train_batch_begin(self, trainer, batch, indices) -> None:
        self.seen.setdefault(str(trainer.cur_epoch_idx), []).extend(int(i) for i in batch["idx"].numpy().ravel())

    def on_before_backward(self, trainer, outputs) -> None:
        dp = getattr(trainer.driver, "_dp", None)  # does this backward all-reduce in DataParallel's reducer?
        self.synced.append(bool(dp is not None and dp.grad_need_sync))

    def on_train_epoch_end(self, trainer) -> None:
        self.counts["on_train_epoch_end"] += 1

    def on_evaluate_end(self, trainer, results) -> None:
        self.counts["on_evaluate_end"] += 1


class Slow(Callback):
    """Sleeps after each batch; rank 0 writes ``OUT/started`` once 2 batches trained."""

    def __init__(self, seconds: float, out: str) -> None:
        self.seconds, self.out = seconds, out

    def on_train_batch_end(self, trainer) -> None:
        if trainer.driver.is_global_zero and trainer.global_forward_batches == 2:
            open(os.path.join(self.out, "started"), "w").close()
        time.sleep(self.seconds)


class StopAt(Callback):
    """Save a checkpoint after ``at`` batches, then stop (the interrupted half of a resume test)."""

    def __init__(self, at: int, folder: str) -> None:
        self.at, self.folder = at, folder

    def on_train_batch_end(self, trainer) -> None:
        if trainer.global_forward_batches == self.at:
            trainer.save_checkpoint(self.folder)
            raise EarlyStopException("interrupted on purpose")


def build_trainer(model, *, batch_size: int, callbacks: list, evaluate: bool = False,
                  accumulation: int = ACCUMULATION, **options) -> Trainer:
    """The run every phase and the in-process references share (only the batch size and launch differ)."""
    np.random.seed(0)  # paddle's shuffling draws its seed from numpy's global generator
    train = DataLoader(Points(N_TRAIN, seed=0), batch_size=batch_size, shuffle=True)
    extra = {"evaluate_dataloaders": DataLoader(Points(N_EVAL, seed=1), batch_size=EVAL_BATCH),
             "metrics": {"acc": Accuracy()}} if evaluate else {}
    inner = model._layers if isinstance(model, paddle.DataParallel) else model
    optimizer = paddle.optimizer.Momentum(learning_rate=0.1, momentum=0.9, parameters=inner.parameters())
    return Trainer(model, train, optimizer, driver="paddle", n_epochs=N_EPOCHS, accumulation_steps=accumulation,
                   callbacks=callbacks, progress_bar=None, **extra, **options)


def params_of(model: paddle.nn.Layer) -> dict[str, list[float]]:
    return {name: p.numpy().astype(np.float64).ravel().tolist() for name, p in model.named_parameters()}


# ------------------------------------------------------------------------------ train
def run_phase(phase: str, args: argparse.Namespace, launch: dict) -> None:
    model = make_net()
    trainable = model
    if args.user_init:
        import paddle.distributed as dist

        if not dist.is_initialized():
            dist.init_parallel_env()
        trainable = paddle.DataParallel(model)
    recorder = Recorder()
    zero_calls: list = []
    callbacks: list = [recorder]
    run_options: dict = {}
    if phase == "full":
        callbacks.append(CheckpointCallback(os.path.join(args.out, "ckpt-full"), every_n_epochs=1, save_last=False))
    elif phase == "interrupt":
        callbacks.append(StopAt(INTERRUPT_AT, os.path.join(args.out, "interrupted")))
    elif phase in ("resume", "resume-same"):
        run_options["resume_from"] = args.resume_from if phase == "resume" else os.path.join(args.out, "interrupted")
    tag = phase
    if phase == "slurm":
        tag += os.environ.get("SLURM_RESTART_COUNT", "0") if "SLURM_JOB_ID" in os.environ else "nproc"
        callbacks.append(CheckpointCallback(os.path.join(args.out, "ckpt"), every_n_batches=2))
        if args.slow:
            callbacks.append(Slow(args.slow, args.out))
        launch = {**launch, "loggers": ["jsonl"], "run_dir": os.path.join(args.out, f"run-{tag[5:]}")}
        run_options["resume_from"] = "latest"
    trainer = build_trainer(trainable, batch_size=BATCH_PER_RANK, callbacks=callbacks, evaluate=phase == "full",
                            **launch)
    trainer.add_callback_fn(Event.on_train_end(), rank_zero_only(lambda t: zero_calls.append(1)))
    trainer.run(num_eval_sanity_batch=0, **run_options)
    driver = trainer.driver
    result = {
        "rank": driver.rank, "world_size": driver.world_size, "driver": type(driver).__name__,
        "describe": driver.describe(), "params": params_of(model), "seen": recorder.seen,
        "counts": recorder.counts, "zero_only": len(zero_calls), "pid": os.getpid(), "synced": recorder.synced,
        "log_dir_in_cwd": os.path.isdir("log"), "steps": [recorder.began, trainer.global_forward_batches],
    }
    if phase == "full":
        result["eval"] = trainer.evaluate()
        data = Points(N_EVAL, seed=1)
        with paddle.no_grad():
            pred = driver.unwrap_model()(paddle.to_tensor(data.x))["pred"].numpy()
        result["eval_by_hand"] = float((pred.argmax(-1) == data.target).mean())
        result["pred_by_hand"] = pred.tolist()
        # prediction: every rank predicts its shard; each gets the whole set back, in dataset order
        predicted = trainer.predict(DataLoader(Points(N_EVAL, seed=1), batch_size=EVAL_BATCH))
        indices = trainer.predict(DataLoader(Points(N_EVAL, seed=1), batch_size=EVAL_BATCH),
                                  predict_fn=lambda x, idx: {"idx": idx})["idx"]
        streamed = trainer.predict(DataLoader(Points(N_EVAL, seed=1), batch_size=EVAL_BATCH),
                                   save_to=os.path.join(args.out, "predictions"))
        result["predict"] = {"pred": predicted["pred"].tolist(), "idx": indices.tolist()}
        result["streamed_equal"] = bool((streamed["pred"] == predicted["pred"]).all())
    with open(os.path.join(args.out, f"{tag}-rank{driver.rank}.json"), "w") as f:
        json.dump(result, f)


class HalfUsed(paddle.nn.Layer):
    """Rank 1 adds a second layer's output; rank 0 never touches that layer."""

    def __init__(self) -> None:
        super().__init__()
        self.used = paddle.nn.Linear(4, 3)
        self.rank_one_only = paddle.nn.Linear(4, 3)

    def forward(self, x, target) -> dict:
        pred = self.used(x)
        if paddle.distributed.get_rank() == 1:
            pred = pred + self.rank_one_only(x)
        return {"loss": paddle.nn.functional.cross_entropy(pred, target)}


def run_unused(args: argparse.Namespace) -> None:
    """Without find_unused_parameters the first step is refused on every rank; with it, training works."""
    result: dict = {}
    for flag in (False, True):
        paddle.seed(0)
        model = HalfUsed()
        before = params_of(model)
        np.random.seed(0)
        trainer = Trainer(model, DataLoader(Points(16, seed=0), batch_size=4, shuffle=True),
                          paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters()), driver="paddle",
                          n_epochs=1, progress_bar=None, paddle_kwargs={"find_unused_parameters": flag, **overlap(args)})
        try:
            trainer.run()
        except Exception as exc:  # noqa: BLE001 - recorded for the test
            result[str(flag)] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        result[str(flag)] = {"before": before, "after": params_of(model)}
    with open(os.path.join(args.out, f"unused-rank{paddle.distributed.get_rank()}.json"), "w") as f:
        json.dump(result, f)


def overlap(args: argparse.Namespace) -> dict:
    """``{"overlap": True/False}`` as ``--overlap on/off`` asks, or nothing (the default)."""
    return {} if args.overlap is None else {"overlap": args.overlap == "on"}


def train(args: argparse.Namespace) -> None:
    launch: dict = {}
    if args.nproc:
        launch["nproc"] = args.nproc
    paddle_kwargs = {}
    if args.prefix:
        paddle_kwargs["spawn_output"] = "prefix"
    if args.fleet:
        paddle_kwargs["fleet"] = True
    paddle_kwargs.update(overlap(args))
    if paddle_kwargs:
        launch["paddle_kwargs"] = paddle_kwargs
    for phase in args.phases.split(","):
        if phase == "unused":
            run_unused(args)
            continue
        run_phase(phase, args, launch)
        launch.pop("paddle_kwargs", None)  # later phases reuse the parallel environment: no start-up options
        if args.overlap is not None:
            launch["paddle_kwargs"] = overlap(args)  # not a start-up option: every phase gets it
    print(f"rank-done {os.environ.get('PADDLE_TRAINER_ID', '0')}", flush=True)


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
    rank = os.environ.get("PADDLE_TRAINER_ID", "0")
    with open(os.path.join(args.out, f"pid-rank{rank}"), "w") as f:
        f.write(str(os.getpid()))
    if args.mode == "early" and rank == "1":
        sys.exit(3)  # dies before reaching Trainer(...)
    model = make_net()
    options: dict = {"paddle_kwargs": {"timeout": args.timeout, **overlap(args)}}
    if "PADDLE_TRAINERS_NUM" not in os.environ:
        options["nproc"] = 2
    trainer = Trainer(model, DataLoader(Points(400, seed=0), batch_size=2, shuffle=True),
                      paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters()), driver="paddle",
                      n_epochs=1, progress_bar=None, callbacks=[Misbehave(args.out, args.mode, args.victim)],
                      **options)
    trainer.run()


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train")
    t.add_argument("out")
    t.add_argument("phases")
    t.add_argument("--nproc", type=int)
    t.add_argument("--user-init", action="store_true")
    t.add_argument("--fleet", action="store_true")
    t.add_argument("--prefix", action="store_true")
    t.add_argument("--resume-from")
    t.add_argument("--slow", type=float, default=0.0)
    for p in (t, f := sub.add_parser("fail")):
        p.add_argument("--overlap", choices=("on", "off"), help="paddle_kwargs['overlap'] (default: the driver's)")
    f.add_argument("out")
    f.add_argument("mode", choices=("raise", "stall", "mark", "early"))
    f.add_argument("--victim", type=int, default=1)
    f.add_argument("--timeout", type=float, default=30.0)
    args = parser.parse_args()
    {"train": train, "fail": fail}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
