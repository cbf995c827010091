"""Train a small MLP on scikit-learn's digits (ships offline) and print the dev accuracy.

    python examples/digits.py                  # torch on CPU, ~10 s; the run record goes to runs/digits-torch
    drivetrain plot runs/digits-torch          # its curves (pip install matplotlib)
    python examples/digits.py --precision bf16
    python examples/digits.py --driver paddle  # paddle on CPU; install from a checkout (see the README):
                                               #   pip install -c constraints.txt -e . -e backends/paddle paddlepaddle==3.3.1
    python examples/digits.py --driver jittor  # jittor on CPU; pip install -c constraints.txt -e . -e backends/jittor
                                               #   (the first run compiles jittor's operators, ~4 min)
    python examples/digits.py --driver oneflow # oneflow on CPU, Python 3.10 only (see docs/backends/oneflow.md)
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402


def load_data(seed: int = 0) -> tuple[dict, dict]:
    """Digits scaled to [0, 1], split 80/20 with stratification."""
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    x_tr, x_dev, y_tr, y_dev = train_test_split(x, y, test_size=0.2, random_state=seed, stratify=y)
    return {"x": x_tr, "target": y_tr}, {"x": x_dev, "target": y_dev}


def run_torch(epochs: int, precision: str, progress_bar: str | None, records: dict) -> float:
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, Dataset

    from drivetrain import Accuracy, Event, Trainer

    torch.set_num_threads(1)
    torch.manual_seed(0)

    class DictDataset(Dataset):
        def __init__(self, arrays: dict) -> None:
            self.arrays = {k: torch.from_numpy(v) for k, v in arrays.items()}

        def __len__(self) -> int:
            return len(self.arrays["x"])

        def __getitem__(self, i: int) -> dict:
            return {k: v[i] for k, v in self.arrays.items()}

    class MLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))

        def forward(self, x, target):
            logits = self.net(x)
            return {"loss": nn.functional.cross_entropy(logits, target), "pred": logits}

    train, dev = load_data()
    model = MLP()
    trainer = Trainer(
        model,
        driver="torch",
        device="cpu",
        train_dataloader=DataLoader(DictDataset(train), batch_size=32, shuffle=True),
        optimizers=torch.optim.Adam(model.parameters(), lr=2e-3),
        evaluate_dataloaders={"dev": DataLoader(DictDataset(dev), batch_size=256)},
        metrics={"acc": Accuracy()},
        n_epochs=epochs,
        evaluate_every=-1,
        monitor="acc",
        precision=precision,
        progress_bar=progress_bar,
        **records,
    )
    results = {}
    trainer.add_callback_fn(Event.on_evaluate_end(), lambda t, r: results.update(r))
    trainer.run()
    return results["acc#acc#dev"]


def run_paddle(epochs: int, precision: str, progress_bar: str | None, records: dict) -> float:
    import warnings

    os.environ.setdefault("GLOG_minloglevel", "2")  # paddle's C++ INFO lines
    with warnings.catch_warnings():  # paddle warns at import when ccache is not installed
        warnings.simplefilter("ignore")
        import paddle
    from paddle import nn

    from drivetrain import Accuracy, Event, Trainer, seed_everything

    seed_everything(0)  # python, numpy (paddle's DataLoader shuffles with it) and paddle

    class DictDataset(paddle.io.Dataset):
        """numpy arrays in, numpy samples out: the DataLoader turns them into paddle tensors."""

        def __init__(self, arrays: dict) -> None:
            self.arrays = arrays

        def __len__(self) -> int:
            return len(self.arrays["x"])

        def __getitem__(self, i: int) -> dict:
            return {k: v[i] for k, v in self.arrays.items()}

    class MLP(nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))

        def forward(self, x, target):
            logits = self.net(x)
            return {"loss": nn.functional.cross_entropy(logits, target), "pred": logits}

    train, dev = load_data()
    model = MLP()
    trainer = Trainer(
        model,
        driver="paddle",
        device="cpu",
        train_dataloader=paddle.io.DataLoader(DictDataset(train), batch_size=32, shuffle=True),
        optimizers=paddle.optimizer.Adam(learning_rate=2e-3, parameters=model.parameters()),
        evaluate_dataloaders={"dev": paddle.io.DataLoader(DictDataset(dev), batch_size=256)},
        metrics={"acc": Accuracy()},
        n_epochs=epochs,
        evaluate_every=-1,
        monitor="acc",
        precision=precision,  # fp16/bf16 on CPU: a warning, then fp32 (paddle has no CPU kernels for them)
        progress_bar=progress_bar,
        **records,
    )
    results = {}
    trainer.add_callback_fn(Event.on_evaluate_end(), lambda t, r: results.update(r))
    trainer.run()
    return results["acc#acc#dev"]


def run_jittor(epochs: int, precision: str, progress_bar: str | None, records: dict) -> float:
    from drivetrain_jittor import import_jittor

    jt = import_jittor()  # sets jittor's import environment; says so if jittor compiles (first use: minutes)
    from drivetrain import Accuracy, Event, Trainer, seed_everything

    seed_everything(0)  # python, numpy (the Dataset's order) and jittor

    class Digits(jt.dataset.Dataset):
        def __init__(self, arrays: dict, **attrs) -> None:
            super().__init__()
            self.arrays = {"x": arrays["x"], "target": arrays["target"].astype(np.int32)}
            self.set_attrs(total_len=len(arrays["x"]), **attrs)

        def __getitem__(self, i: int) -> dict:
            return {k: v[i] for k, v in self.arrays.items()}

    class MLP(jt.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = jt.nn.Sequential(jt.nn.Linear(64, 128), jt.nn.ReLU(), jt.nn.Linear(128, 10))

        def execute(self, x, target):
            logits = self.net(x)
            return {"loss": jt.nn.cross_entropy_loss(logits, target), "pred": logits}

    train, dev = load_data()
    model = MLP()
    trainer = Trainer(
        model,
        driver="jittor",
        device="cpu",
        train_dataloader=Digits(train, batch_size=32, shuffle=True),
        optimizers=jt.optim.Adam(model.parameters(), lr=2e-3),
        evaluate_dataloaders={"dev": Digits(dev, batch_size=256)},
        metrics={"acc": Accuracy()},
        n_epochs=epochs,
        evaluate_every=-1,
        monitor="acc",
        precision=precision,  # fp16 is jittor's global AMP flag: opt in with jittor_kwargs (below)
        jittor_kwargs={"amp_level": 4} if precision == "fp16" else None,
        progress_bar=progress_bar,
        **records,
    )
    results = {}
    trainer.add_callback_fn(Event.on_evaluate_end(), lambda t, r: results.update(r))
    trainer.run()
    return results["acc#acc#dev"]


def run_oneflow(epochs: int, precision: str, progress_bar: str | None, records: dict) -> float:
    os.environ.setdefault("GLOG_minloglevel", "2")  # oneflow's C++ INFO lines
    import oneflow as flow
    from oneflow import nn

    from drivetrain import Accuracy, Event, Trainer, seed_everything

    seed_everything(0)  # python, numpy and oneflow (the shuffling seed is drawn from oneflow's generator)

    class DictDataset(flow.utils.data.Dataset):
        """numpy arrays in, numpy samples out: the DataLoader turns them into oneflow tensors."""

        def __init__(self, arrays: dict) -> None:
            self.arrays = arrays

        def __len__(self) -> int:
            return len(self.arrays["x"])

        def __getitem__(self, i: int) -> dict:
            return {k: v[i] for k, v in self.arrays.items()}

    class MLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))

        def forward(self, x, target):
            logits = self.net(x)
            return {"loss": nn.functional.cross_entropy(logits, target), "pred": logits}

    train, dev = load_data()
    model = MLP()
    trainer = Trainer(
        model,
        driver="oneflow",
        device="cpu",
        train_dataloader=flow.utils.data.DataLoader(DictDataset(train), batch_size=32, shuffle=True),
        optimizers=flow.optim.Adam(model.parameters(), lr=2e-3),
        evaluate_dataloaders={"dev": flow.utils.data.DataLoader(DictDataset(dev), batch_size=256)},
        metrics={"acc": Accuracy()},
        n_epochs=epochs,
        evaluate_every=-1,
        monitor="acc",
        precision=precision,  # fp16/bf16 on CPU: a warning, then fp32 (oneflow autocasts on CUDA only)
        progress_bar=progress_bar,
        **records,
    )
    results = {}
    trainer.add_callback_fn(Event.on_evaluate_end(), lambda t, r: results.update(r))
    trainer.run()
    return results["acc#acc#dev"]


RUNNERS = {"torch": run_torch, "paddle": run_paddle, "jittor": run_jittor, "oneflow": run_oneflow}


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--driver", default="torch", choices=sorted(RUNNERS))
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"])
    parser.add_argument("--progress-bar", default="auto")
    parser.add_argument("--run-dir", help="where the run record goes (default: runs/digits-<driver>)")
    parser.add_argument("--no-record", action="store_true", help="write no run record")
    args = parser.parse_args(argv)
    records = {} if args.no_record else {
        "loggers": ["csv", "jsonl"], "log_every_n_steps": 10, "run_dir": args.run_dir or f"runs/digits-{args.driver}"}
    acc = RUNNERS[args.driver](args.epochs, args.precision, args.progress_bar, records)
    print(f"dev accuracy: {acc:.4f}")
    return acc


if __name__ == "__main__":
    main()
