"""The per-process side of the MPI tests: run by ``mpirun -np 2`` from test_jittor_mpi.py.

    python _mpi_script.py MODE OUT_DIR [CKPT_DIR]

Modes (every process writes ``OUT_DIR/rank<r>.json`` and, for training modes,
``OUT_DIR/params<r>.npz``):

- ``train``: the Trainer on a shuffled jittor Dataset (64 samples, global batch 8),
  SGD, 2 epochs, with evaluation (Accuracy) and the driver's collectives exercised;
- ``checkpoint``: like ``train`` with Adam, a CheckpointCallback every 3 batches, and
  every process raising after batch 5 (the test then resumes);
- ``resume``: ``checkpoint``'s run resumed from CKPT_DIR to the end;
- ``unbroken``: ``checkpoint``'s run without the interruption;
- ``fail``: rank 1 raises after batch 3 while rank 0 goes on (into the next all-reduce);
- ``kill``: rank 1 SIGKILLs itself after batch 3;
- ``devices``: a device list that does not match the processes (the error is recorded);
- ``refuse``: data the driver cannot share out, or shares unevenly (the errors are recorded).
"""

from __future__ import annotations

import json
import os
import signal
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np  # noqa: E402

from drivetrain_jittor import import_jittor  # noqa: E402

jt = import_jittor()

from drivetrain import Accuracy, CheckpointCallback, DriverError, Event, Trainer, seed_everything  # noqa: E402
from tests.jittor.conftest import Points, TinyNet  # noqa: E402

SAMPLES, GLOBAL_BATCH, EPOCHS = 64, 8, 2
EVAL_BATCH, PREDICT_BATCH = 6, 5


def build(optimizer: str = "sgd", callbacks=None, metrics: bool = False) -> Trainer:
    seed_everything(0)
    model = TinyNet()
    opt = (jt.optim.SGD(model.parameters(), lr=0.1) if optimizer == "sgd"
           else jt.optim.Adam(model.parameters(), lr=0.01))
    extra = {}
    if metrics:
        # evaluation and prediction in other batch sizes than training's (8), odd ones too
        extra = {"evaluate_dataloaders": Points(30, seed=1, batch_size=EVAL_BATCH), "metrics": {"acc": Accuracy()}}
    return Trainer(model, Points(SAMPLES, batch_size=GLOBAL_BATCH, shuffle=True), opt, driver="jittor",
                   device="cpu", n_epochs=EPOCHS, progress_bar=None, callbacks=callbacks, **extra)


def write(out: str, rank: int, record: dict, trainer: Trainer | None = None) -> None:
    if trainer is not None:
        params = {k: v.numpy() for k, v in trainer.driver.model_state().items()}
        np.savez(os.path.join(out, f"params{rank}.npz"), **params)
        record["global_forward_batches"] = trainer.global_forward_batches
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(record, f)


def main(mode: str, out: str, ckpt: str | None) -> None:
    rank = int(jt.rank)
    record: dict = {"rank": rank, "world_size": int(jt.world_size)}
    if mode == "devices":
        for name, kwargs in (("device_list", {"device": ["cpu", "cpu", "cpu"]}), ("nproc", {"nproc": 3})):
            try:
                Trainer(TinyNet(), Points(16, batch_size=8), jt.optim.SGD(TinyNet().parameters(), lr=0.1),
                        driver="jittor", progress_bar=None, **({"device": "cpu"} | kwargs))
                record[name] = None
            except DriverError as exc:
                record[name] = str(exc)
        write(out, rank, record)
        return
    if mode == "refuse":
        def attempt(data, **options) -> str | None:
            model = TinyNet()
            try:
                Trainer(model, data, jt.optim.SGD(model.parameters(), lr=0.1), driver="jittor", device="cpu",
                        n_epochs=1, progress_bar=None, **options).run(num_eval_sanity_batch=0)
            except DriverError as exc:
                return str(exc)
            return None

        batches = [{"x": np.zeros((4, 4), np.float32), "target": np.zeros(4, np.int32)}] * (3 + rank)
        record["plain_list"] = attempt(batches)
        record["odd_batch"] = attempt(Points(16, batch_size=7))
        record["uneven"] = attempt(batches, use_dist_sampler=False)
        write(out, rank, record)
        return
    if mode == "train":
        trainer = build(metrics=True)
        driver = trainer.driver
        record["describe"] = driver.describe()
        record["seen"] = []
        trainer.add_callback_fn(Event.on_train_batch_begin(),
                                lambda t, batch, indices: record["seen"].append(batch["index"].numpy().tolist()))
        results: dict = {}
        trainer.add_callback_fn(Event.on_evaluate_end(), lambda t, r: results.update(r))
        trainer.run(num_eval_sanity_batch=0)
        record["results"] = results
        # prediction: each rank predicts its shard of the 30 samples; every rank gets all of them in order
        predicted = trainer.predict(Points(30, seed=1, batch_size=PREDICT_BATCH), predict_fn=lambda x, index: {
            "pred": driver.unwrap_model()(x)["pred"], "index": index})
        record["predicted_index"] = predicted["index"].tolist()
        record["predicted"] = predicted["pred"].tolist()
        record["gathered"] = driver.all_gather_object({"rank": rank, "text": "x" * (rank + 3)})
        record["broadcast"] = driver.broadcast_object([rank, "from"], src=1)
        record["sum"] = driver.all_reduce(np.array([rank + 1, 10], dtype=np.int64), "sum").tolist()
        record["max"] = driver.all_reduce(np.array([rank * 1.5, -rank], dtype=np.float32), "max").tolist()
        record["min"] = driver.all_reduce(np.array([rank * 1.5, -rank], dtype=np.float32), "min").tolist()
        driver.barrier()
        write(out, rank, record, trainer)
        return
    if mode in ("checkpoint", "resume", "unbroken"):
        callbacks = [CheckpointCallback(ckpt, every_n_batches=3, save_last=False)] if mode != "unbroken" else None
        trainer = build("adam", callbacks=callbacks)
        if mode == "checkpoint":
            def stop(t: Trainer) -> None:
                if t.global_forward_batches == 5:
                    raise RuntimeError("stopped on purpose")

            trainer.add_callback_fn(Event.on_train_batch_end(), stop)
        trainer.run(num_eval_sanity_batch=0, resume_from=ckpt if mode == "resume" else None)
        write(out, rank, record, trainer)
        return
    trainer = build()

    def misbehave(t: Trainer) -> None:
        if t.global_forward_batches == 3 and rank == 1:
            if mode == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError("rank 1 fails on purpose")

    trainer.add_callback_fn(Event.on_train_batch_end(), misbehave)
    trainer.run(num_eval_sanity_batch=0)
    write(out, rank, record, trainer)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None)
