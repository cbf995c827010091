"""The child process of the kill -9 tests: trains a fixed problem, checkpointing after every batch.

    python _kill9_train.py CKPT_DIR OUT_FILE [--resume] [--driver DRIVER] [--nproc N] [--pid-dir DIR]

- The problem of ``_kill9_models.py`` for ``--driver`` (numpy, torch, torch_fsdp, deepspeed, paddle, oneflow,
  jittor, jax): shuffled data, dropout (numpy: noise from the global RNG), Adam, gradient accumulation over 3
  batches, 3 epochs.
- A ``CheckpointCallback(CKPT_DIR, every_n_batches=1, keep_last_n=2)`` writes a checkpoint after every batch
  and deletes all but the newest two (a rotation, so kills also land inside deletions); the JSON dict in
  ``DRIVETRAIN_KILL9_CHECKPOINT_KWARGS`` adds keyword arguments to it or replaces these
  (``{"background": true}``, ``{"every_n_batches": 2}``...).
  torch_fsdp and deepspeed save at the end of every accumulation cycle instead (every 3 batches): they hold
  the gradients of an unfinished cycle in their own buffers and refuse to checkpoint inside one.
- ``--nproc N`` (N > 1): ``Trainer(nproc=N)`` starts the other processes (data parallel, or sharded for
  torch_fsdp and deepspeed), with ``<driver>_kwargs={"timeout": DRIVETRAIN_KILL9_DIST_TIMEOUT}`` (default 10 s).
  jittor is started under ``mpirun -np N`` by the parent instead and takes no ``--nproc``.
- ``--pid-dir DIR``: every rank writes its pid to ``DIR/rank<r>`` once its Trainer is built, so that the parent
  can kill one rank.
- ``--resume``: continue from the newest complete checkpoint in CKPT_DIR (``resume_from="latest"``), or start
  from scratch when there is none yet (the previous process was killed before its first checkpoint was complete).
- At the end rank 0 writes to OUT_FILE (``.npz``, atomically) every tensor of the newest checkpoint (model,
  optimizer, random generators, shard files alike) as raw bytes under ``<file>::<name>``, and
  ``__global_forward_batches__``: what the parent compares byte for byte with the uninterrupted run.
- ``DRIVETRAIN_KILL9_SAVE_DELAY`` (seconds, default 0): sleep before each file a save
  writes, inside the temporary folder, so that a kill lands inside a save often.
- ``DRIVETRAIN_KILL9_STEP_DELAY`` (seconds, default 0): sleep at the start of each batch,
  standing in for the compute of a real model, so that kills also land between saves.

On stdout rank 0 prints ``begin <global_forward_batches> <unix time>`` when training
begins (after any resume) and ``done <global_forward_batches> <unix time>`` at the end;
the parent uses them to time its kills, to tell where a kill landed and to check
which checkpoint was resumed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # run by path, in every rank
from _kill9_models import BUILDERS, TIMEOUT_OPTION  # noqa: E402

KEEP = 2
N_EPOCHS = 3
ACCUMULATION = 3
CYCLE_ONLY = ("torch_fsdp", "deepspeed")  # drivers that checkpoint only where an accumulation cycle ends
CHECKPOINT_KWARGS_ENV = "DRIVETRAIN_KILL9_CHECKPOINT_KWARGS"
DIST_TIMEOUT_ENV = "DRIVETRAIN_KILL9_DIST_TIMEOUT"


def slow_down_saves(delay: float) -> None:
    """Sleep ``delay`` before each file of a checkpoint is written (inside the temp folder)."""
    if delay <= 0:
        return
    from drivetrain._format import folder

    write = folder._write_and_hash

    def slow_write(path, data):
        time.sleep(delay)
        return write(path, data)

    folder._write_and_hash = slow_write


def checkpoint_kwargs() -> dict:
    """The extra keyword arguments of the CheckpointCallback, from ``DRIVETRAIN_KILL9_CHECKPOINT_KWARGS``."""
    text = os.environ.get(CHECKPOINT_KWARGS_ENV, "").strip()
    kwargs = json.loads(text) if text else {}
    if not isinstance(kwargs, dict):
        raise SystemExit(f"{CHECKPOINT_KWARGS_ENV}={text!r} is not a JSON object")
    return kwargs


def checkpoint_tensors(ckpt_dir: str) -> dict[str, np.ndarray]:
    """Every tensor of the newest complete checkpoint in ``ckpt_dir``, as raw bytes keyed ``<file>::<name>``."""
    from drivetrain._format import list_checkpoints
    from drivetrain._format.safetensors_reader import read_entries

    newest, manifest = list_checkpoints(ckpt_dir)[-1]
    tensors = {}
    for filename in sorted(manifest["files"]):
        if not filename.endswith(".safetensors"):
            continue
        with open(os.path.join(newest, filename), "rb") as f:
            data = memoryview(f.read())
        entries, _ = read_entries(filename, data)
        for name, dtype, shape, view in entries:
            tensors[f"{filename}::{name}:{dtype}{list(shape)}"] = np.frombuffer(bytes(view), np.uint8)
    return tensors


def build(args: argparse.Namespace, ckpt_dir: str):
    from drivetrain import CheckpointCallback

    saving = {"every_n_batches": ACCUMULATION if args.driver in CYCLE_ONLY else 1, "keep_last_n": KEEP,
              **checkpoint_kwargs()}  # the environment's win
    options: dict = {"n_epochs": N_EPOCHS, "accumulation_steps": ACCUMULATION, "progress_bar": None,
                     "callbacks": [CheckpointCallback(ckpt_dir, **saving)]}
    if args.nproc > 1:
        options["nproc"] = args.nproc
    if args.nproc > 1 or "MASTER_PORT" in os.environ or args.driver == "jittor":  # every rank, under any launcher
        if args.driver in TIMEOUT_OPTION:
            options[TIMEOUT_OPTION[args.driver]] = {"timeout": float(os.environ.get(DIST_TIMEOUT_ENV, "10"))}
    return BUILDERS[args.driver](args.driver, **options)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("ckpt_dir")
    parser.add_argument("out_file")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--driver", choices=sorted(BUILDERS), default="numpy")
    parser.add_argument("--nproc", type=int, default=1)
    parser.add_argument("--pid-dir")
    args = parser.parse_args(argv)

    from drivetrain import Event

    ckpt_dir = os.path.abspath(args.ckpt_dir)
    trainer = build(args, ckpt_dir)
    driver = trainer.driver
    if args.pid_dir:
        os.makedirs(args.pid_dir, exist_ok=True)
        path = os.path.join(args.pid_dir, f"rank{driver.rank}")
        with open(f"{path}.tmp", "w") as f:  # renamed once written: the parent reads it as soon as it exists
            f.write(str(os.getpid()))
        os.replace(f"{path}.tmp", path)
    slow_down_saves(float(os.environ.get("DRIVETRAIN_KILL9_SAVE_DELAY", "0")))
    zero = driver.is_global_zero

    def announce(t) -> None:
        if zero:
            print(f"begin {t.global_forward_batches} {time.time():.6f}", flush=True)

    trainer.add_callback_fn(Event.on_train_begin(), announce)
    step_delay = float(os.environ.get("DRIVETRAIN_KILL9_STEP_DELAY", "0"))
    if step_delay > 0:
        trainer.add_callback_fn(Event.on_train_batch_begin(), lambda t, batch, indices: time.sleep(step_delay))
    begun = []
    trainer.add_callback_fn(Event.on_train_begin(), lambda t: begun.append(True))
    trainer.run(resume_from="latest" if args.resume else None, num_eval_sanity_batch=0)
    if not begun:  # the kill came after the final checkpoint: its resume has nothing to train (no on_train_begin)
        announce(trainer)
    if not zero:
        return 0
    tensors = checkpoint_tensors(ckpt_dir)
    tmp = f"{args.out_file}.tmp-{os.getpid()}.npz"
    np.savez(tmp, __global_forward_batches__=np.array(trainer.global_forward_batches), **tensors)
    os.replace(tmp, args.out_file)
    print(f"done {trainer.global_forward_batches} {time.time():.6f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
