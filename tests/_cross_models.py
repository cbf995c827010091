"""The same small Conv/BatchNorm/Linear network in torch, paddle, jittor and oneflow, under the same attribute names,
and a ResNet-18 written in torch with torchvision's layout (torchvision does not import with our pinned torch).

Used by each framework's cross-framework tests and by ``tests/_cross_generate.py``, which writes the committed
model folders under ``tests/data/cross_framework/``. Each builder imports its framework only when called.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "cross_framework")
FRAMEWORKS = ("torch", "paddle", "jittor", "oneflow")
TOLERANCE = 1e-4
"""Largest absolute logit difference accepted between two frameworks (fp32)."""


def training_batches(seed: int = 0) -> list[dict[str, np.ndarray]]:
    """Eight batches of four 3x6x6 images with a class in 0..2, the same in every framework."""
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((4, 3, 6, 6)).astype(np.float32), "y": rng.integers(0, 3, 4).astype(np.int64)}
            for _ in range(8)]


def probe_input(seed: int = 1) -> np.ndarray:
    """The input the logits are compared on."""
    return np.random.default_rng(seed).standard_normal((5, 3, 6, 6)).astype(np.float32)


def torch_net() -> Any:
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.bn = nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4)
            self.fc1, self.fc2 = nn.Linear(4, 4), nn.Linear(4, 3)  # fc1 square: a missed transpose keeps its shape

        def forward(self, x: Any) -> Any:
            h = torch.relu(self.bn(self.conv(x))).mean(dim=(2, 3))
            return self.fc2(torch.relu(self.fc1(h)))

        def train_step(self, x: Any, y: Any) -> dict:
            return {"loss": nn.functional.cross_entropy(self(x), y)}

    return Net()


def paddle_net() -> Any:
    from paddle import nn

    class Net(nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.bn = nn.Conv2D(3, 4, 3, padding=1), nn.BatchNorm2D(4)
            self.fc1, self.fc2 = nn.Linear(4, 4), nn.Linear(4, 3)

        def forward(self, x: Any) -> Any:
            h = nn.functional.relu(self.bn(self.conv(x))).mean(axis=(2, 3))
            return self.fc2(nn.functional.relu(self.fc1(h)))

        def train_step(self, x: Any, y: Any) -> dict:
            return {"loss": nn.functional.cross_entropy(self(x), y)}

    return Net()


def jittor_net() -> Any:
    from drivetrain_jittor import import_jittor

    jt = import_jittor()
    nn = jt.nn

    class Net(jt.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.bn = nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4)
            self.fc1, self.fc2 = nn.Linear(4, 4), nn.Linear(4, 3)

        def execute(self, x: Any) -> Any:
            h = nn.relu(self.bn(self.conv(x))).mean(dims=(2, 3))
            return self.fc2(nn.relu(self.fc1(h)))

        def train_step(self, x: Any, y: Any) -> dict:
            return {"loss": nn.cross_entropy_loss(self(x), y)}

    return Net()


def oneflow_net() -> Any:
    import oneflow as flow
    from oneflow import nn

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.bn = nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4)
            self.fc1, self.fc2 = nn.Linear(4, 4), nn.Linear(4, 3)

        def forward(self, x: Any) -> Any:
            h = flow.relu(self.bn(self.conv(x))).mean(dim=(2, 3))
            return self.fc2(flow.relu(self.fc1(h)))

        def train_step(self, x: Any, y: Any) -> dict:
            return {"loss": nn.functional.cross_entropy(self(x), y)}

    return Net()


BUILDERS = {"torch": torch_net, "paddle": paddle_net, "jittor": jittor_net, "oneflow": oneflow_net}


def to_tensor(framework: str, array: np.ndarray) -> Any:
    """``array`` as a tensor of ``framework``."""
    if framework == "torch":
        import torch
        return torch.from_numpy(array.copy())
    if framework == "paddle":
        import paddle
        return paddle.to_tensor(array)
    if framework == "jittor":
        from drivetrain_jittor import import_jittor
        return import_jittor().array(array)
    import oneflow as flow
    return flow.tensor(array)


def logits(framework: str, model: Any, x: np.ndarray) -> np.ndarray:
    """The model's logits on ``x`` in evaluation mode, as numpy."""
    model.eval()
    out = model(to_tensor(framework, x))
    return out.numpy() if framework != "torch" else out.detach().numpy()


def optimizer(framework: str, model: Any) -> Any:
    """Plain SGD over the model's parameters, lr 0.1."""
    if framework == "torch":
        import torch
        return torch.optim.SGD(model.parameters(), lr=0.1)
    if framework == "paddle":
        import paddle
        return paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
    if framework == "jittor":
        from drivetrain_jittor import import_jittor
        return import_jittor().nn.SGD(model.parameters(), lr=0.1)
    import oneflow as flow
    return flow.optim.SGD(model.parameters(), lr=0.1)


def train(framework: str, model: Any, n_epochs: int = 2) -> Any:
    """Train ``model`` through drivetrain's Trainer for ``n_epochs`` over :func:`training_batches`; the Trainer."""
    from drivetrain import Trainer

    batches = [{k: to_tensor(framework, v) for k, v in b.items()} for b in training_batches()]
    trainer = Trainer(model, batches, optimizers=optimizer(framework, model), driver=framework, device="cpu",
                      n_epochs=n_epochs, progress_bar=None)
    trainer.run()
    return trainer


def torch_resnet18(num_classes: int = 1000) -> Any:
    """ResNet-18 in torch under torchvision's module names (conv1, bn1, layer1.0.conv1, ..., downsample.0/1, fc)."""
    from torch import nn

    class BasicBlock(nn.Module):
        def __init__(self, inplanes: int, planes: int, stride: int = 1) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(planes)
            self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(planes)
            self.relu = nn.ReLU()
            self.downsample = None
            if stride != 1 or inplanes != planes:
                self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride, bias=False),
                                                nn.BatchNorm2d(planes))

        def forward(self, x: Any) -> Any:
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            return self.relu(out + (x if self.downsample is None else self.downsample(x)))

    class ResNet18(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
            self.bn1 = nn.BatchNorm2d(64)
            self.relu, self.maxpool = nn.ReLU(), nn.MaxPool2d(3, 2, 1)
            widths = [(64, 64, 1), (64, 128, 2), (128, 256, 2), (256, 512, 2)]
            for i, (inplanes, planes, stride) in enumerate(widths, 1):
                setattr(self, f"layer{i}", nn.Sequential(BasicBlock(inplanes, planes, stride),
                                                         BasicBlock(planes, planes)))
            self.avgpool, self.fc = nn.AdaptiveAvgPool2d(1), nn.Linear(512, num_classes)

        def forward(self, x: Any) -> Any:
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            return self.fc(self.avgpool(x).flatten(1))

    return ResNet18()


def randomize_statistics(framework: str, model: Any, seed: int) -> None:
    """Give every BatchNorm non-trivial running statistics (a fresh one has mean 0, variance 1: a swapped or
    missing statistic would go unnoticed) by running the model in training mode on random batches."""
    model.train()
    rng = np.random.default_rng(seed)
    for _ in range(2):
        model(to_tensor(framework, rng.standard_normal((2, 3, 32, 32)).astype(np.float32) * 2 + 0.5))
    if framework == "jittor":
        from drivetrain_jittor import import_jittor
        import_jittor().sync_all()


def max_difference(a: np.ndarray, b: np.ndarray) -> float:
    """The largest absolute difference between two logit arrays of the same shape."""
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max())


def committed_difference(framework: str, source: str) -> float:
    """Load the committed folder ``source`` wrote into a fresh ``framework`` model through drivetrain; the largest
    logit difference from the logits ``source`` saved beside it."""
    import drivetrain

    probe = np.load(os.path.join(DATA, source, "probe.npz"))
    model = drivetrain.load_weights(BUILDERS[framework](), os.path.join(DATA, source, "model"), driver=framework)
    return max_difference(logits(framework, model, probe["x"]), probe["logits"])


def trainer_for(framework: str, model: Any) -> Any:
    """A Trainer of ``model`` in ``framework`` (one batch of data), for save_model/load_model."""
    from drivetrain import Trainer

    batch = {k: to_tensor(framework, v) for k, v in training_batches()[0].items()}
    return Trainer(model, [batch], optimizers=optimizer(framework, model), driver=framework, device="cpu",
                   progress_bar=None)


def live_difference(source: str, target: str, folder: str) -> float:
    """Train the network in ``source`` through drivetrain, save it to ``folder``, load it into a ``target`` model
    with ``trainer.load_model``; the largest logit difference on the probe input."""
    import drivetrain

    drivetrain.seed_everything(0)
    trained = BUILDERS[source]()
    train(source, trained).save_model(folder)
    moved = BUILDERS[target]()
    trainer_for(target, moved).load_model(folder)
    x = probe_input()
    return max_difference(logits(target, moved, x), logits(source, trained, x))
