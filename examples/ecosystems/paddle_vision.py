"""paddle.vision's ResNet-18, unchanged, trained and served by drivetrain.

    python examples/ecosystems/paddle_vision.py   # CPU, seconds; nothing is downloaded

The model is `paddle.vision.models.resnet18` with random weights (`pretrained=True`
would download ImageNet weights). The data are synthetic 3x16x16 images of 10
classes from a `paddle.io.DataLoader` over a dataset whose samples are dicts. The
script trains two epochs, evaluates with `Accuracy`, predicts, saves the weights
and loads them into a fresh ResNet-18, then interrupts a run and resumes it from
its newest checkpoint into another fresh model: the weights come out identical.
"""

from __future__ import annotations

import os
import tempfile
import warnings

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("GLOG_minloglevel", "2")  # paddle's C++ INFO lines

import numpy as np  # noqa: E402

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # "No ccache found" when paddle is imported: harmless
    import paddle

from paddle.vision.models import resnet18  # noqa: E402

from drivetrain import (  # noqa: E402
    Accuracy,
    CheckpointCallback,
    Evaluator,
    Event,
    Trainer,
    predict,
    seed_everything,
)

# paddle's BatchNorm warns on every training forward that it tracks running statistics: nothing to act on
warnings.filterwarnings("ignore", "When training, we now always track global mean and variance")

NUM_CLASSES = 10
# resnet18's forward(self, x) takes the images as "x": rename the batch key, once, for everything
INPUT_MAPPING = {"image": "x"}


class SyntheticImages(paddle.io.Dataset):
    """Noisy copies of one fixed random pattern per class; each sample is {"image", "label"}."""

    def __init__(self, n: int, seed: int, size: int = 16) -> None:
        patterns = np.random.default_rng(1234).standard_normal((NUM_CLASSES, 3, size, size)).astype(np.float32)
        rng = np.random.default_rng(seed)
        self.labels = rng.integers(0, NUM_CLASSES, n)  # int64
        noise = rng.standard_normal((n, 3, size, size)).astype(np.float32)
        self.images = patterns[self.labels] + 0.5 * noise

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict:
        return {"image": self.images[i], "label": self.labels[i]}


def loss_fn(outputs, batch):
    """The zoo model returns bare logits; the Trainer computes the loss from them and the batch."""
    return paddle.nn.functional.cross_entropy(outputs, batch["label"])


def make_loaders():
    train_loader = paddle.io.DataLoader(SyntheticImages(128, seed=0), batch_size=16, shuffle=True)
    dev_loader = paddle.io.DataLoader(SyntheticImages(100, seed=1), batch_size=50)
    return train_loader, dev_loader


def new_trainer(train_loader, dev_loader=None, **options) -> Trainer:
    """A random-weight ResNet-18, its optimizer and a Trainer around them."""
    model = resnet18(num_classes=NUM_CLASSES)
    optimizer = paddle.optimizer.Adam(learning_rate=1e-3, parameters=model.parameters())
    if dev_loader is not None:
        options.update(evaluate_dataloaders={"dev": dev_loader}, metrics={"acc": Accuracy()})
    return Trainer(model, train_loader, optimizer, driver="paddle", device="cpu", n_epochs=2,
                   input_mapping=INPUT_MAPPING, loss_fn=loss_fn, progress_bar=options.pop("progress_bar", None),
                   **options)


def train(train_loader, dev_loader, progress_bar=None) -> Trainer:
    seed_everything(0)  # python, numpy (the shuffling) and paddle (the initial weights)
    trainer = new_trainer(train_loader, dev_loader, progress_bar=progress_bar)
    trainer.run(num_eval_sanity_batch=0)
    return trainer


def predict_and_reload(trainer: Trainer, dev_loader, folder: str) -> tuple[dict, dict, float]:
    """Predict; save the weights, load them into a fresh ResNet-18 and predict and evaluate with it."""
    predictions = trainer.predict(dev_loader)  # {"pred": logits}, numpy, dataset order
    trainer.save_model(folder)
    fresh = new_trainer(trainer.train_dataloader)
    fresh.load_model(folder)
    reloaded = predict(fresh.model, dev_loader, driver="paddle", device="cpu", input_mapping=INPUT_MAPPING,
                       progress_bar=None)
    results = Evaluator(fresh.model, {"dev": dev_loader}, {"acc": Accuracy()}, driver="paddle", device="cpu",
                        input_mapping=INPUT_MAPPING, progress_bar=None, verbose=0).run()
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
