"""drivetrain computes what the usual jittor loop computes, bit for bit, on a network with BatchNorm.

The usual loop is ``opt.step(loss)`` per batch, or with accumulation ``opt.backward(loss / k)`` per
batch and ``opt.step()`` every k batches. jittor runs each step's work lazily, as one execution at the
next step; the BatchNorm running statistics are part of it. Splitting it (computing the statistics on
their own in the driver's backward, as the driver once did) made jittor fuse and round differently:
one ulp at step 1, then a different model. The same network, trained with accumulation, also resumes
bit-exactly against a run that was never stopped and evaluated on the way.
"""

from __future__ import annotations

import numpy as np
import pytest

from drivetrain import Accuracy, CheckpointCallback, Event, Trainer, seed_everything

from .._usual_loop import (
    BATCH,
    CASES,
    CHANNELS,
    CLASSES,
    WIDTH,
    assert_identical,
    image_batches,
    train_with_trainer,
)
from .conftest import jt

pytestmark = pytest.mark.jittor


class ConvBNNet(jt.Module):
    """Two conv + BatchNorm blocks (the second residual) and a Linear on the pooled features."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.bn1 = jt.nn.Conv2d(CHANNELS, WIDTH, 3, padding=1), jt.nn.BatchNorm2d(WIDTH)
        self.conv2, self.bn2 = jt.nn.Conv2d(WIDTH, WIDTH, 3, padding=1), jt.nn.BatchNorm2d(WIDTH)
        self.fc = jt.nn.Linear(WIDTH, CLASSES)

    def execute(self, x, label):
        h = jt.nn.relu(self.bn1(self.conv1(x)))
        h = jt.nn.relu(self.bn2(self.conv2(h)) + h)
        pred = self.fc(h.mean(dims=(2, 3)))
        return {"pred": pred, "loss": jt.nn.cross_entropy_loss(pred, label)}


def _build(optimizer: str):
    jt.set_global_seed(0)  # the initial weights
    model = ConvBNNet()
    if optimizer == "sgd":
        return model, jt.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return model, jt.optim.Adam(model.parameters(), lr=0.01)


def _state(model) -> dict[str, np.ndarray]:
    return {name: value.numpy().copy() for name, value in model.state_dict().items()}


def _batches() -> list[dict]:
    return [{"x": jt.array(b["x"]), "label": jt.array(b["label"].astype(np.int32))} for b in image_batches()]


def usual_loop(batches: list[dict], optimizer: str, accumulation: int) -> dict[str, np.ndarray]:
    """What a jittor user writes."""
    model, opt = _build(optimizer)
    model.train()
    for i, batch in enumerate(batches):
        loss = model(batch["x"], batch["label"])["loss"]
        if accumulation == 1:
            opt.step(loss)
        else:
            opt.backward(loss / accumulation)
            if (i + 1) % accumulation == 0:
                opt.step()
    return _state(model)


@pytest.mark.parametrize("optimizer, accumulation", CASES)
def test_the_trainer_ends_bit_identical_to_the_usual_jittor_loop(optimizer, accumulation) -> None:
    batches = _batches()
    want = usual_loop(batches, optimizer, accumulation)
    model, opt = _build(optimizer)
    initial = _state(model)
    train_with_trainer(model, batches, opt, "jittor", accumulation)
    assert_identical(_state(model), want, initial)


class Images(jt.dataset.Dataset):
    """The first ``n`` of the same images as a shuffled jittor Dataset: a resume must also find its place in the order."""

    def __init__(self, n: int, **attrs) -> None:
        super().__init__()
        batches = image_batches(-(-n // BATCH))
        self.x = np.concatenate([b["x"] for b in batches])[:n]
        self.label = np.concatenate([b["label"] for b in batches])[:n].astype(np.int32)
        self.set_attrs(total_len=n, **attrs)

    def __getitem__(self, i):
        return {"x": self.x[i], "label": self.label[i]}


def _resumable(callbacks=None, evaluate=False):
    seed_everything(0)
    model, opt = _build("adam")
    options = {}
    if evaluate:  # every 3 batches: at the end of a cycle and inside one
        options = dict(evaluate_dataloaders={"dev": Images(16, batch_size=BATCH)}, metrics={"acc": Accuracy()},
                       evaluate_every=3)
    # 100 samples: epochs of 13 batches, the last one of 4 samples and a cycle of its own
    return model, Trainer(model, Images(100, batch_size=BATCH, shuffle=True), opt, driver="jittor", device="cpu",
                          n_epochs=2, accumulation_steps=3, progress_bar=None, callbacks=callbacks, **options)


def test_a_batchnorm_run_with_accumulation_resumes_bit_identically(tmp_path) -> None:
    model, reference = _resumable(evaluate=True)  # the evaluations read the running statistics
    initial = _state(model)
    reference.run(num_eval_sanity_batch=0)
    ckpt = str(tmp_path / "ckpt")
    _, first = _resumable([CheckpointCallback(ckpt, every_n_batches=4, save_last=False)])

    def stop(trainer):
        if trainer.global_forward_batches == 18:  # epoch 1, batch 5: resumed from the checkpoint of batch 16
            raise RuntimeError("stopped on purpose")

    first.add_callback_fn(Event.on_train_batch_end(), stop)
    with pytest.raises(RuntimeError, match="stopped on purpose"):
        first.run(num_eval_sanity_batch=0, catch_KeyboardInterrupt=False)
    resumed_model, resumed = _resumable()
    resumed.run(num_eval_sanity_batch=0, resume_from=ckpt)
    assert resumed.global_forward_batches == reference.global_forward_batches == 26
    assert_identical(_state(resumed_model), _state(model), initial, what="the resumed run", than="the unbroken run")
