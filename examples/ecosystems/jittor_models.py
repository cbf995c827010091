"""jittor.models' ResNet-18, unchanged, trained and served by drivetrain.

    python examples/ecosystems/jittor_models.py   # CPU; nothing is downloaded (the first run compiles jittor's ops)

The model is `jittor.models.resnet18` with random weights (`pretrained=True` would
download weights). The data are synthetic 3x16x16 images of 10 classes from a
`jittor.dataset.Dataset` subclass whose samples are `(image, label)` tuples, jittor's
own convention. The script trains two epochs, evaluates with `Accuracy`, predicts,
saves the weights and loads them into a fresh ResNet-18, then interrupts a run and
resumes it from its newest checkpoint into another fresh model: the weights come
out identical.
"""

from __future__ import annotations

import os
import tempfile

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from drivetrain_jittor import import_jittor  # noqa: E402

jt = import_jittor()  # sets what jittor needs before its import (no CUDA probe, no download, no torch)

from jittor.models import resnet18  # noqa: E402

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


class SyntheticImages(jt.dataset.Dataset):
    """Noisy copies of one fixed random pattern per class; each sample is an (image, label) tuple."""

    def __init__(self, n: int, seed: int, size: int = 16, **attrs) -> None:
        super().__init__()
        patterns = np.random.default_rng(1234).standard_normal((NUM_CLASSES, 3, size, size)).astype(np.float32)
        rng = np.random.default_rng(seed)
        self.labels = rng.integers(0, NUM_CLASSES, n)
        noise = rng.standard_normal((n, 3, size, size)).astype(np.float32)
        self.images = patterns[self.labels] + 0.5 * noise
        self.set_attrs(total_len=n, **attrs)

    def __getitem__(self, i: int):
        return self.images[i], self.labels[i]


def input_mapping(batch):
    """A batch is the tuple (images, labels); resnet18's execute(self, x) wants "x". Applied once, for everything."""
    images, labels = batch
    return {"x": images, "label": labels}


def loss_fn(outputs, batch):
    """The zoo model returns bare logits; the Trainer computes the loss from them and the (mapped) batch."""
    return jt.nn.cross_entropy_loss(outputs, batch["label"])


def make_loaders():
    """A jittor Dataset is its own data loader."""
    return SyntheticImages(128, seed=0, batch_size=16, shuffle=True), SyntheticImages(100, seed=1, batch_size=50)


def new_trainer(train_loader, dev_loader=None, **options) -> Trainer:
    """A random-weight ResNet-18, its optimizer and a Trainer around them."""
    model = resnet18(num_classes=NUM_CLASSES)
    optimizer = jt.optim.Adam(model.parameters(), lr=1e-3)
    if dev_loader is not None:
        options.update(evaluate_dataloaders={"dev": dev_loader}, metrics={"acc": Accuracy()})
    return Trainer(model, train_loader, optimizer, driver="jittor", device="cpu", n_epochs=2,
                   input_mapping=input_mapping, loss_fn=loss_fn, progress_bar=options.pop("progress_bar", None),
                   **options)


def train(train_loader, dev_loader, progress_bar=None) -> Trainer:
    seed_everything(0)  # python, numpy and jittor: the shuffling and the initial weights
    trainer = new_trainer(train_loader, dev_loader, progress_bar=progress_bar)
    trainer.run(num_eval_sanity_batch=0)
    return trainer


def predict_and_reload(trainer: Trainer, dev_loader, folder: str) -> tuple[dict, dict, float]:
    """Predict; save the weights, load them into a fresh ResNet-18 and predict and evaluate with it."""
    predictions = trainer.predict(dev_loader)  # {"pred": logits}, numpy, dataset order
    trainer.save_model(folder)
    fresh = new_trainer(trainer.train_dataloader)
    fresh.load_model(folder)
    reloaded = predict(fresh.model, dev_loader, driver="jittor", device="cpu", input_mapping=input_mapping,
                       progress_bar=None)
    results = Evaluator(fresh.model, {"dev": dev_loader}, {"acc": Accuracy()}, driver="jittor", device="cpu",
                        input_mapping=input_mapping, progress_bar=None, verbose=0).run()
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
