"""The problem the kill -9 child trains, once per engine: a small MLP with dropout and Adam on shuffled data.

Every builder takes the Trainer's options (callbacks, ``nproc``, ``<driver>_kwargs``...) and returns the
Trainer, so that ``_kill9_train.py`` is the same for every engine. The numpy test driver has no dropout or
Adam: its model draws noise from numpy's global RNG and steps with SGD. Data: 96 samples of 8 features (60
of 3 for numpy), batches of 8 per process (4 for numpy), shuffled by the engine's own loader; gradient
accumulation over 3 batches and 3 epochs come from ``_kill9_train.py``.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

N_SAMPLES, N_FEATURES, BATCH = 96, 8, 8


def pairs() -> tuple[np.ndarray, np.ndarray]:
    """The features and two-class labels every framework's builder trains on."""
    x = np.random.default_rng(0).standard_normal((N_SAMPLES, N_FEATURES)).astype(np.float32)
    return x, (x[:, 0] - x[:, 3] > 0).astype(np.int64)


def build_numpy(driver: str, **options: Any):
    from drivetrain import Trainer, seed_everything
    from drivetrain_numpy import SGD, ArrayLoader, LinearModel

    seed_everything(0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((60, 3)).astype(np.float32)
    data = {"x": x, "target": (x @ np.array([[1.0], [-2.0], [3.0]], np.float32) + 0.5).astype(np.float32)}
    model = LinearModel(3, 1, seed=0, noise=0.3)
    loader = ArrayLoader(data, batch_size=4, shuffle=True, seed=11)
    return Trainer(model, loader, SGD(model.params, model.grads, lr=0.05), driver=driver, **options)


def mlp_and_pairs(nn: Any, module_base: type, dataset_base: type, cross_entropy: Callable) -> tuple[type, type]:
    """The model and the map-style dataset of torch, paddle and oneflow, which share these APIs (``nn.Sequential``,
    ``nn.Linear``..., ``forward``, ``__len__``/``__getitem__``) under other names."""

    class MLP(module_base):  # type: ignore[misc,valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(N_FEATURES, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 2))

        def forward(self, x, y):
            return {"loss": cross_entropy(self.net(x), y)}

    class Pairs(dataset_base):  # type: ignore[misc,valid-type]
        def __init__(self) -> None:
            self.x, self.y = pairs()

        def __len__(self) -> int:
            return len(self.y)

        def __getitem__(self, i):
            return {"x": self.x[i], "y": self.y[i]}

    return MLP, Pairs


def build_torch(driver: str, **options: Any):
    """``driver``: ``torch`` (one process or DDP), ``torch_fsdp`` or ``deepspeed``: the same model."""
    import torch

    from drivetrain import Trainer, seed_everything

    torch.set_num_threads(1)
    MLP, Pairs = mlp_and_pairs(torch.nn, torch.nn.Module, torch.utils.data.Dataset, torch.nn.functional.cross_entropy)
    seed_everything(0)
    loader = torch.utils.data.DataLoader(Pairs(), batch_size=BATCH, shuffle=True)
    model = MLP()
    return Trainer(model, loader, torch.optim.Adam(model.parameters(), lr=1e-2), driver=driver, device="cpu",
                   **options)


def build_paddle(driver: str, **options: Any):
    os.environ.setdefault("GLOG_minloglevel", "2")
    with warnings.catch_warnings():  # paddle warns at import when ccache is not installed
        warnings.simplefilter("ignore")
        import paddle

    from drivetrain import Trainer, seed_everything

    MLP, Pairs = mlp_and_pairs(paddle.nn, paddle.nn.Layer, paddle.io.Dataset, paddle.nn.functional.cross_entropy)
    seed_everything(0)
    loader = paddle.io.DataLoader(Pairs(), batch_size=BATCH, shuffle=True)
    model = MLP()
    opt = paddle.optimizer.Adam(learning_rate=1e-2, parameters=model.parameters())
    return Trainer(model, loader, opt, driver=driver, device="cpu", **options)


def build_oneflow(driver: str, **options: Any):
    os.environ.setdefault("GLOG_minloglevel", "2")
    import oneflow as flow

    from drivetrain import Trainer, seed_everything

    MLP, Pairs = mlp_and_pairs(flow.nn, flow.nn.Module, flow.utils.data.Dataset, flow.nn.functional.cross_entropy)
    seed_everything(0)
    loader = flow.utils.data.DataLoader(Pairs(), batch_size=BATCH, shuffle=True)
    model = MLP()
    return Trainer(model, loader, flow.optim.Adam(model.parameters(), lr=1e-2), driver=driver, device="cpu",
                   **options)


def build_jittor(driver: str, **options: Any):
    """Under ``mpirun -np 2`` jittor shards the dataset itself: the same code, no ``nproc``."""
    from drivetrain_jittor import import_jittor

    jt = import_jittor()
    from drivetrain import Trainer, seed_everything

    class MLP(jt.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = jt.nn.Sequential(jt.nn.Linear(N_FEATURES, 32), jt.nn.ReLU(), jt.nn.Dropout(0.3),
                                        jt.nn.Linear(32, 2))

        def execute(self, x, y):
            return {"loss": jt.nn.cross_entropy_loss(self.net(x), y)}

    class Pairs(jt.dataset.Dataset):
        def __init__(self) -> None:
            super().__init__(batch_size=BATCH, shuffle=True)
            x, y = pairs()
            self.x, self.y = x, y.astype(np.int32)
            self.set_attrs(total_len=N_SAMPLES)

        def __getitem__(self, i):
            return {"x": self.x[i], "y": self.y[i]}

    seed_everything(0)
    model = MLP()
    return Trainer(model, Pairs(), jt.optim.Adam(model.parameters(), lr=1e-2), driver=driver, device="cpu",
                   **options)


def build_jax(driver: str, **options: Any):
    import optax
    from flax import nnx

    from drivetrain import Trainer, seed_everything
    from drivetrain_jax import DataLoader

    class MLP(nnx.Module):
        def __init__(self) -> None:
            rngs = nnx.Rngs(0)
            self.linear1, self.linear2 = nnx.Linear(N_FEATURES, 32, rngs=rngs), nnx.Linear(32, 2, rngs=rngs)
            self.dropout = nnx.Dropout(0.3, rngs=rngs)

        def __call__(self, x, y):
            logits = self.linear2(self.dropout(nnx.relu(self.linear1(x))))
            return {"loss": optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()}

    x, y = pairs()
    seed_everything(0)
    model = MLP()
    loader = DataLoader([{"x": x[i], "y": y[i].astype(np.int32)} for i in range(N_SAMPLES)], batch_size=BATCH,
                        shuffle=True)
    return Trainer(model, loader, nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param), driver=driver, **options)


BUILDERS: dict[str, Callable[..., Any]] = {
    "numpy": build_numpy, "torch": build_torch, "torch_fsdp": build_torch, "deepspeed": build_torch,
    "paddle": build_paddle, "oneflow": build_oneflow, "jittor": build_jittor, "jax": build_jax,
}
"""The builder of each driver name the child accepts."""

TIMEOUT_OPTION = {"torch": "torch_kwargs", "torch_fsdp": "torch_fsdp_kwargs", "deepspeed": "deepspeed_kwargs",
                  "paddle": "paddle_kwargs", "oneflow": "oneflow_kwargs", "jax": "jax_kwargs"}
"""Where each distributed driver takes ``{"timeout": seconds}``, the bound on waiting for a dead rank (jittor's MPI
driver has none: ``mpirun`` ends the job when a rank dies)."""
