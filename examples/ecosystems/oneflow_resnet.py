"""A small ResNet built from oneflow.nn, trained and served by drivetrain.

    python examples/ecosystems/oneflow_resnet.py   # Python 3.10 (oneflow 0.9.0), CPU, seconds

flowvision, oneflow's model zoo, does not import with oneflow 0.9.0, so the model is
a ResNet written the way such zoos write them (convolutions, batch norm, residual
blocks, a forward that returns bare logits). The data are synthetic 3x16x16 images of
10 classes from a `oneflow.utils.data.DataLoader` over a dataset whose samples are
dicts named like forward's parameter, so no input mapping is needed. The script
trains two epochs, evaluates with `Accuracy`, predicts, saves the weights and loads
them into a fresh model, then interrupts a run and resumes it from its newest
checkpoint into another fresh model: the weights come out identical.
"""

from __future__ import annotations

import os
import tempfile

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("GLOG_minloglevel", "2")  # oneflow's C++ INFO/WARNING lines

import numpy as np  # noqa: E402
import oneflow as flow  # noqa: E402
from oneflow import nn  # noqa: E402

from drivetrain import (  # noqa: E402
    Accuracy,
    CheckpointCallback,
    Evaluator,
    Event,
    Trainer,
    predict,
    seed_everything,
)

NUM_CLASSES = 10


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with batch norm, added to a shortcut (1x1 convolution where the shape changes)."""

    def __init__(self, in_channels: int, channels: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.shortcut = nn.Identity()
        if stride != 1 or in_channels != channels:
            self.shortcut = nn.Sequential(nn.Conv2d(in_channels, channels, 1, stride=stride, bias=False),
                                          nn.BatchNorm2d(channels))

    def forward(self, x):
        out = flow.relu(self.bn1(self.conv1(x)))
        return flow.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class ResNet(nn.Module):
    def __init__(self, num_classes: int = NUM_CLASSES, widths: tuple[int, ...] = (16, 32, 64)) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 3, padding=1, bias=False), nn.BatchNorm2d(widths[0]),
                                  nn.ReLU())
        blocks, channels = [], widths[0]
        for i, width in enumerate(widths):
            blocks += [BasicBlock(channels, width, stride=1 if i == 0 else 2), BasicBlock(width, width)]
            channels = width
        self.blocks = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(channels, num_classes)

    def forward(self, x):
        return self.fc(flow.flatten(self.pool(self.blocks(self.stem(x))), 1))  # bare logits


class SyntheticImages(flow.utils.data.Dataset):
    """Noisy copies of one fixed random pattern per class; each sample is {"x", "label"}."""

    def __init__(self, n: int, seed: int, size: int = 16) -> None:
        patterns = np.random.default_rng(1234).standard_normal((NUM_CLASSES, 3, size, size)).astype(np.float32)
        rng = np.random.default_rng(seed)
        self.labels = rng.integers(0, NUM_CLASSES, n)  # int64
        noise = rng.standard_normal((n, 3, size, size)).astype(np.float32)
        self.images = patterns[self.labels] + 0.5 * noise

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict:
        return {"x": self.images[i], "label": self.labels[i]}


def loss_fn(outputs, batch):
    """The model returns bare logits; the Trainer computes the loss from them and the batch."""
    return nn.functional.cross_entropy(outputs, batch["label"])


def make_loaders():
    train_loader = flow.utils.data.DataLoader(SyntheticImages(128, seed=0), batch_size=16, shuffle=True)
    dev_loader = flow.utils.data.DataLoader(SyntheticImages(100, seed=1), batch_size=50)
    return train_loader, dev_loader


def new_trainer(train_loader, dev_loader=None, **options) -> Trainer:
    """A randomly initialised ResNet, its optimizer and a Trainer around them."""
    model = ResNet()
    optimizer = flow.optim.Adam(model.parameters(), lr=1e-2)
    if dev_loader is not None:
        options.update(evaluate_dataloaders={"dev": dev_loader}, metrics={"acc": Accuracy()})
    return Trainer(model, train_loader, optimizer, driver="oneflow", device="cpu", n_epochs=2, loss_fn=loss_fn,
                   progress_bar=options.pop("progress_bar", None), **options)


def train(train_loader, dev_loader, progress_bar=None) -> Trainer:
    seed_everything(0)  # python, numpy and oneflow: the shuffling and the initial weights
    trainer = new_trainer(train_loader, dev_loader, progress_bar=progress_bar)
    trainer.run(num_eval_sanity_batch=0)
    return trainer


def predict_and_reload(trainer: Trainer, dev_loader, folder: str) -> tuple[dict, dict, float]:
    """Predict; save the weights, load them into a fresh model and predict and evaluate with it."""
    predictions = trainer.predict(dev_loader)  # {"pred": logits}, numpy, dataset order
    trainer.save_model(folder)
    fresh = new_trainer(trainer.train_dataloader)
    fresh.load_model(folder)
    reloaded = predict(fresh.model, dev_loader, driver="oneflow", device="cpu", progress_bar=None)
    results = Evaluator(fresh.model, {"dev": dev_loader}, {"acc": Accuracy()}, driver="oneflow", device="cpu",
                        progress_bar=None, verbose=0).run()
    return predictions, reloaded, results["acc#acc#dev"]


def interrupt_and_resume(train_loader, folder: str, stop_at: int = 11) -> Trainer:
    """Stop a run after ``stop_at`` batches (as Ctrl-C would) and resume it into a fresh model and optimizer."""
    seed_everything(0)  # the same start as train()
    interrupted = new_trainer(train_loader, callbacks=[CheckpointCallback(folder, every_n_batches=5)])

    def ctrl_c(trainer):
        if trainer.global_forward_batches == stop_at:
            raise KeyboardInterrupt

    interrupted.add_callback_fn(Event.on_train_batch_end(), ctrl_c)
    try:
        interrupted.run()
    except KeyboardInterrupt:  # Ctrl-C reaches the script once the checkpoints are safe; the newest is step 10's
        pass
    resumed = new_trainer(train_loader)  # as a new process would: a fresh model and optimizer
    resumed.run(resume_from=folder)  # takes the newest checkpoint in the folder
    return resumed


def main(folder: str) -> None:
    train_loader, dev_loader = make_loaders()
    trainer = train(train_loader, dev_loader, progress_bar="auto")
    accuracy = trainer.evaluate()["acc#acc#dev"]  # Accuracy takes "pred" (the logits) and "label"
    print(f"dev accuracy after 2 epochs: {accuracy:.3f} (chance: {1 / NUM_CLASSES:.2f})")
    predictions, reloaded, reloaded_accuracy = predict_and_reload(trainer, dev_loader, os.path.join(folder, "model"))
    print({name: array.shape for name, array in predictions.items()})  # {'pred': (100, 10)}
    print("the reloaded model predicts the same:", np.array_equal(predictions["pred"], reloaded["pred"]))
    resumed = interrupt_and_resume(train_loader, os.path.join(folder, "checkpoints"))
    same = all(np.array_equal(a.numpy(), b.numpy())
               for a, b in zip(trainer.model.state_dict().values(), resumed.model.state_dict().values(), strict=True))
    print("interrupted + resumed == uninterrupted, bit for bit:", same)


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        main(tmp)
