"""The script the JAX process tests launch: ``python _jax_script.py OUT PHASE`` (phases below).

- ``train``: ``nproc=2`` in a plain ``python`` run (the Trainer supervises two workers under drivetrain_jax.run):
  an MLP with batch norm, 8 samples per rank and step, accumulation over 2 batches, 2 epochs, a checkpoint every 3
  batches, an evaluation of accuracy with each rank reading its own shard; each rank writes ``OUT/train-<r>.json``
  (its gradient exchanges, its collectives' answers, the evaluation) and rank 0 ``OUT/train.npz``.
  The same run with dropout follows, its end in ``OUT/dropout.npz`` and its checkpoints in ``OUT/ckpt-0.3``.
- ``resume``: started by a launcher (``python -m drivetrain_jax.run --nproc_per_node 2``): the dropout run resumed
  from its checkpoint of step 8 (mid-epoch, where a cycle ends: batch statistics are averaged there, so rank 0's
  are every rank's); rank 0 writes ``OUT/resume.npz``.
- ``fail``: started by ``torchrun -m drivetrain_jax.run`` (or ``nproc=2`` without torch); rank 1 raises at its
  batch 3, and every process must end within ``jax_kwargs['timeout']`` (10 s) of that.
"""

from __future__ import annotations

import glob
import json
import os
import sys

import numpy as np
import optax
from flax import nnx

from drivetrain import Accuracy, CheckpointCallback, Event, Trainer, seed_everything
from drivetrain_jax import DataLoader

N, PER_RANK = 96, 8


class Net(nnx.Module):
    """Without dropout: a layer norm (two halves of a batch normalise as the whole does); with it: a batch norm."""

    def __init__(self, dropout: float) -> None:
        rngs = nnx.Rngs(0)
        self.linear1, self.linear2 = nnx.Linear(8, 16, rngs=rngs), nnx.Linear(16, 3, rngs=rngs)
        self.norm = nnx.BatchNorm(16, rngs=rngs) if dropout else nnx.LayerNorm(16, rngs=rngs)
        self.dropout = nnx.Dropout(dropout, rngs=rngs)

    def __call__(self, x, target):
        logits = self.linear2(self.dropout(nnx.relu(self.norm(self.linear1(x)))))
        return {"loss": optax.softmax_cross_entropy_with_integer_labels(logits, target).mean(), "pred": logits}


def data(seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((N, 8)).astype(np.float32)
    target = ((x[:, 0] > 0).astype(np.int32) + (x[:, 1] > 0).astype(np.int32))
    return [{"x": x[i], "target": target[i]} for i in range(N)]


def trainer(batch_size: int, dropout: float = 0.0, **options) -> Trainer:
    seed_everything(0)
    model = Net(dropout)
    return Trainer(model, DataLoader(data(), batch_size=batch_size, shuffle=True),
                   nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param), driver="jax", n_epochs=2,
                   accumulation_steps=2, progress_bar=None, **options)


def save(out: str, name: str, t: Trainer) -> None:
    if t.driver.is_global_zero:
        np.savez(os.path.join(out, name), **{k: np.asarray(v) for k, v in t.driver.model_state().items()})


def main(out: str, phase: str) -> None:
    if phase == "fail":
        t = trainer(PER_RANK, nproc=2 if "WORLD_SIZE" not in os.environ else None, jax_kwargs={"timeout": 10})

        def fail(t):
            if t.driver.rank == 1 and t.global_forward_batches == 3:
                raise RuntimeError("rank 1 fails on purpose")

        t.add_callback_fn(Event.on_train_batch_end(), fail)
        t.run()
        return
    dropout = 0.0 if phase == "train" else 0.3
    callbacks = [CheckpointCallback(os.path.join(out, f"ckpt-{dropout}"), every_n_batches=2, save_last=False)]
    t = trainer(PER_RANK, dropout, callbacks=callbacks, nproc=2 if phase == "train" else None,
                evaluate_dataloaders={"dev": DataLoader(data(1), batch_size=10)}, metrics={"acc": Accuracy()})
    driver = t.driver
    exchanges = []
    exchange = driver._exchange
    driver._exchange = lambda grads: exchanges.append(t.global_forward_batches) or exchange(grads)
    if phase == "resume":
        t.run(resume_from=sorted(glob.glob(os.path.join(out, "ckpt-0.3", "step_00000008*")))[0])
        save(out, "resume.npz", t)
        return
    t.run()
    save(out, "train.npz", t)
    record = {"rank": driver.rank, "exchanges": exchanges, "eval": t.evaluate(),
              "sum": driver.all_reduce(np.array([2**40 + driver.rank], np.int64), "sum").tolist(),
              "gathered": driver.all_gather_object({"rank": driver.rank}), "describe": driver.describe(),
              "broadcast": driver.broadcast_object(driver.rank + 10, src=1)}
    with open(os.path.join(out, f"train-{driver.rank}.json"), "w") as f:
        json.dump(record, f)
    if phase == "train":  # the same run with dropout: its end, and its checkpoints for the resume phase
        t = trainer(PER_RANK, 0.3, callbacks=[CheckpointCallback(os.path.join(out, "ckpt-0.3"), every_n_batches=2,
                                                                 save_last=False)], nproc=2)
        t.run()
        save(out, "dropout.npz", t)
        stats = t.driver.all_gather_object(np.asarray(t.model.norm.mean[...]).tolist())
        assert stats[0] == stats[1], stats  # batch statistics averaged: the same model in every process


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
