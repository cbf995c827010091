"""The child process of the kill -9 tests: trains a fixed problem, checkpointing after every batch.

    python _kill9_train.py CKPT_DIR OUT_FILE [--resume] [--driver numpy|torch|paddle|oneflow|jittor]

- Seeded, shuffled data, random noise in the forward pass (numpy's global RNG for the
  numpy driver, dropout for torch and paddle), gradient accumulation over 3 batches, 3 epochs.
- After every batch a checkpoint ``CKPT_DIR/step-NNNNNN`` is written and all but the
  newest ``KEEP`` are deleted (a rotation, so kills also land inside deletions).
- ``--resume``: continue from the newest complete checkpoint in CKPT_DIR, or start
  from scratch when there is none yet (the previous process was killed before its
  first checkpoint was complete).
- At the end the final parameters are written to OUT_FILE (``.npz``, atomically).
- ``DRIVETRAIN_KILL9_SAVE_DELAY`` (seconds, default 0): sleep before each file a save
  writes, inside the temporary folder, so that a kill lands inside a save often.
- ``DRIVETRAIN_KILL9_STEP_DELAY`` (seconds, default 0): sleep at the start of each batch,
  standing in for the compute of a real model, so that kills also land between saves.

On stdout it prints ``begin <global_forward_batches> <unix time>`` when training
begins (after any resume) and ``done <global_forward_batches> <unix time>`` at the end;
the parent uses them to time its kills, to tell where a kill landed and to check
which checkpoint was resumed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

KEEP = 2
N_EPOCHS = 3
ACCUMULATION = 3


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


def build_numpy():
    from drivetrain import Trainer, seed_everything
    from drivetrain_numpy import SGD, ArrayLoader, LinearModel

    seed_everything(0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((60, 3)).astype(np.float32)
    data = {"x": x, "target": (x @ np.array([[1.0], [-2.0], [3.0]], np.float32) + 0.5).astype(np.float32)}
    model = LinearModel(3, 1, seed=0, noise=0.3)
    loader = ArrayLoader(data, batch_size=4, shuffle=True, seed=11)
    trainer = Trainer(model, loader, SGD(model.params, model.grads, lr=0.05), driver="numpy", n_epochs=N_EPOCHS,
                      accumulation_steps=ACCUMULATION, progress_bar=None)
    return trainer, lambda: {k: v.copy() for k, v in model.params.items()}


def build_torch():
    import torch

    from drivetrain import Trainer, seed_everything

    torch.set_num_threads(1)

    class MLP(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Dropout(0.3),
                                           torch.nn.Linear(32, 2))

        def forward(self, x, y):
            return {"loss": torch.nn.functional.cross_entropy(self.net(x), y)}

    class Pairs(torch.utils.data.Dataset):
        def __init__(self) -> None:
            gen = torch.Generator().manual_seed(0)
            self.x = torch.randn(96, 8, generator=gen)
            self.y = (self.x[:, 0] - self.x[:, 3] > 0).long()

        def __len__(self) -> int:
            return len(self.y)

        def __getitem__(self, i):
            return {"x": self.x[i], "y": self.y[i]}

    seed_everything(0)
    loader = torch.utils.data.DataLoader(Pairs(), batch_size=8, shuffle=True)
    model = MLP()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    trainer = Trainer(model, loader, opt, driver="torch", device="cpu", n_epochs=N_EPOCHS,
                      accumulation_steps=ACCUMULATION, progress_bar=None)
    return trainer, lambda: {k: v.detach().cpu().numpy().copy() for k, v in model.state_dict().items()}


def build_paddle():
    import warnings

    os.environ.setdefault("GLOG_minloglevel", "2")
    with warnings.catch_warnings():  # paddle warns at import when ccache is not installed
        warnings.simplefilter("ignore")
        import paddle

    from drivetrain import Trainer, seed_everything

    class MLP(paddle.nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.net = paddle.nn.Sequential(paddle.nn.Linear(8, 32), paddle.nn.ReLU(), paddle.nn.Dropout(0.3),
                                            paddle.nn.Linear(32, 2))

        def forward(self, x, y):
            return {"loss": paddle.nn.functional.cross_entropy(self.net(x), y)}

    class Pairs(paddle.io.Dataset):
        def __init__(self) -> None:
            rng = np.random.default_rng(0)
            self.x = rng.standard_normal((96, 8)).astype(np.float32)
            self.y = (self.x[:, 0] - self.x[:, 3] > 0).astype(np.int64)

        def __len__(self) -> int:
            return len(self.y)

        def __getitem__(self, i):
            return {"x": self.x[i], "y": self.y[i]}

    seed_everything(0)
    loader = paddle.io.DataLoader(Pairs(), batch_size=8, shuffle=True)
    model = MLP()
    opt = paddle.optimizer.Adam(learning_rate=1e-2, parameters=model.parameters())
    trainer = Trainer(model, loader, opt, driver="paddle", device="cpu", n_epochs=N_EPOCHS,
                      accumulation_steps=ACCUMULATION, progress_bar=None)
    return trainer, lambda: {k: v.numpy().copy() for k, v in model.state_dict().items()}


def build_oneflow():
    os.environ.setdefault("GLOG_minloglevel", "2")
    import oneflow as flow

    from drivetrain import Trainer, seed_everything

    class MLP(flow.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = flow.nn.Sequential(flow.nn.Linear(8, 32), flow.nn.ReLU(), flow.nn.Dropout(0.3),
                                          flow.nn.Linear(32, 2))

        def forward(self, x, y):
            return {"loss": flow.nn.functional.cross_entropy(self.net(x), y)}

    class Pairs(flow.utils.data.Dataset):
        def __init__(self) -> None:
            rng = np.random.default_rng(0)
            self.x = rng.standard_normal((96, 8)).astype(np.float32)
            self.y = (self.x[:, 0] - self.x[:, 3] > 0).astype(np.int64)

        def __len__(self) -> int:
            return len(self.y)

        def __getitem__(self, i):
            return {"x": self.x[i], "y": self.y[i]}

    seed_everything(0)
    loader = flow.utils.data.DataLoader(Pairs(), batch_size=8, shuffle=True)
    model = MLP()
    opt = flow.optim.Adam(model.parameters(), lr=1e-2)
    trainer = Trainer(model, loader, opt, driver="oneflow", device="cpu", n_epochs=N_EPOCHS,
                      accumulation_steps=ACCUMULATION, progress_bar=None)
    return trainer, lambda: {k: v.numpy().copy() for k, v in model.state_dict().items()}


def build_jittor():
    from drivetrain_jittor import import_jittor

    jt = import_jittor()
    from drivetrain import Trainer, seed_everything

    class MLP(jt.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = jt.nn.Sequential(jt.nn.Linear(8, 32), jt.nn.ReLU(), jt.nn.Dropout(0.3), jt.nn.Linear(32, 2))

        def execute(self, x, y):
            return {"loss": jt.nn.cross_entropy_loss(self.net(x), y)}

    class Pairs(jt.dataset.Dataset):
        def __init__(self) -> None:
            super().__init__(batch_size=8, shuffle=True)
            rng = np.random.default_rng(0)
            self.x = rng.standard_normal((96, 8)).astype(np.float32)
            self.y = (self.x[:, 0] - self.x[:, 3] > 0).astype(np.int32)
            self.set_attrs(total_len=96)

        def __getitem__(self, i):
            return {"x": self.x[i], "y": self.y[i]}

    seed_everything(0)
    model = MLP()
    trainer = Trainer(model, Pairs(), jt.optim.Adam(model.parameters(), lr=1e-2), driver="jittor", device="cpu",
                      n_epochs=N_EPOCHS, accumulation_steps=ACCUMULATION, progress_bar=None)
    return trainer, lambda: {k: v.numpy().copy() for k, v in model.state_dict().items()}


BUILDERS = {"numpy": build_numpy, "torch": build_torch, "paddle": build_paddle, "oneflow": build_oneflow,
            "jittor": build_jittor}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("ckpt_dir")
    parser.add_argument("out_file")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--driver", choices=sorted(BUILDERS), default="numpy")
    args = parser.parse_args(argv)

    from drivetrain import Event
    from drivetrain._format import list_checkpoints, remove_checkpoint

    trainer, final_params = BUILDERS[args.driver]()
    slow_down_saves(float(os.environ.get("DRIVETRAIN_KILL9_SAVE_DELAY", "0")))
    ckpt_dir = os.path.abspath(args.ckpt_dir)

    def save_and_rotate(t) -> None:
        t.save_checkpoint(os.path.join(ckpt_dir, f"step-{t.global_forward_batches:06d}"))
        for old, _ in list_checkpoints(ckpt_dir)[:-KEEP]:
            remove_checkpoint(old)

    def announce(t) -> None:
        print(f"begin {t.global_forward_batches} {time.time():.6f}", flush=True)

    trainer.add_callback_fn(Event.on_train_begin(), announce)
    step_delay = float(os.environ.get("DRIVETRAIN_KILL9_STEP_DELAY", "0"))
    if step_delay > 0:
        trainer.add_callback_fn(Event.on_train_batch_begin(), lambda t, batch, indices: time.sleep(step_delay))
    trainer.add_callback_fn(Event.on_train_batch_end(), save_and_rotate)
    resume = args.resume and bool(list_checkpoints(ckpt_dir))
    begun = []
    trainer.add_callback_fn(Event.on_train_begin(), lambda t: begun.append(True))
    trainer.run(resume_from=ckpt_dir if resume else None, num_eval_sanity_batch=0)
    if not begun:  # the kill came after the final checkpoint: its resume has nothing to train (no on_train_begin)
        announce(trainer)

    params = final_params()
    tmp = f"{args.out_file}.tmp-{os.getpid()}.npz"
    np.savez(tmp, __global_forward_batches__=np.array(trainer.global_forward_batches), **params)
    os.replace(tmp, args.out_file)
    print(f"done {trainer.global_forward_batches} {time.time():.6f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
