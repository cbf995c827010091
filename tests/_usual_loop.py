"""The framework-free half of each backend's "same numbers as the framework's own loop" test
(tests/<backend>/test_<backend>_usual_loop.py), and the whole of it for torch and oneflow (one API).

Each backend's test writes the same small network (two conv + BatchNorm blocks, the second one residual,
then a Linear on the pooled features) in its framework, and the loop a user of that framework writes by
hand; it trains one copy through drivetrain's Trainer and one through that loop, from the same seed on
the batches made here, and hands both final states to :func:`assert_identical`: every parameter and
buffer (BatchNorm's running statistics included) must be equal bit for bit, not merely close. A
difference of one ulp at step 1 grows over the steps, so the test trains a few dozen of them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from drivetrain import Trainer

STEPS, BATCH, CLASSES = 36, 8, 4
CHANNELS, SIZE, WIDTH = 3, 8, 8
"""36 batches (divisible by every accumulation the tests use) of 8 RGB 8x8 images; 8 conv channels."""

CASES = [("sgd", 1), ("adam", 1), ("sgd", 2), ("adam", 3)]
"""(optimizer, accumulation_steps): SGD with momentum 0.9 and lr 0.1, or Adam with lr 0.01."""


def image_batches(steps: int = STEPS, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """``steps`` batches ``{"x": float32 [BATCH, 3, 8, 8], "label": int64 [BATCH]}``, the same in every framework."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((steps * BATCH, CHANNELS, SIZE, SIZE)).astype(np.float32)
    label = rng.integers(0, CLASSES, steps * BATCH)
    return [{"x": x[i:i + BATCH], "label": label[i:i + BATCH]} for i in range(0, steps * BATCH, BATCH)]


def assert_identical(got: Mapping[str, np.ndarray], want: Mapping[str, np.ndarray], initial: Mapping[str, np.ndarray],
                     what: str = "drivetrain's Trainer", than: str = "the usual loop") -> None:
    """Every tensor of ``got`` equals ``want``'s bit for bit; ``initial`` (the state before training) shows both moved.

    The message lists each differing tensor with its largest difference, so a failure says how far apart the runs are.
    """
    assert list(got) == list(want), f"the state names differ: {list(got)} != {list(want)}"
    different = {name: float(np.abs(got[name].astype(np.float64) - want[name]).max())
                 for name in want if not np.array_equal(got[name], want[name])}
    assert not different, (f"{what} differs from {than} in {len(different)} of {len(want)} tensors "
                           f"(name: largest difference): {different}")
    unchanged = [name for name in want if name in initial and np.array_equal(want[name], initial[name])
                 and want[name].dtype.kind == "f"]
    assert not unchanged, f"training left these tensors as they started, so the comparison shows nothing: {unchanged}"


def train_with_trainer(model: Any, batches: list[dict[str, Any]], optimizer: Any, driver: str,
                       accumulation: int) -> None:
    """One epoch over ``batches`` through drivetrain's Trainer, on the CPU."""
    Trainer(model, batches, optimizer, driver=driver, device="cpu", n_epochs=1, accumulation_steps=accumulation,
            progress_bar=None).run(num_eval_sanity_batch=0)


def backward_loop(model: Any, batches: list[dict[str, Any]], accumulation: int, step: Callable[[], Any],
                  clear: Callable[[], Any]) -> None:
    """The usual loop of torch, oneflow and paddle: ``loss.backward()`` per batch (``loss / k`` with accumulation),
    ``step()`` then ``clear()`` (``zero_grad``, or paddle's ``clear_grad``) every k batches."""
    model.train()
    for i, batch in enumerate(batches):
        loss = model(batch["x"], batch["label"])["loss"]
        if accumulation > 1:
            loss = loss / accumulation
        loss.backward()
        if (i + 1) % accumulation == 0:
            step()
            clear()


def torch_style_check(fw: Any, driver: str, optimizer: str, accumulation: int) -> None:
    """The whole check for torch and for oneflow, which copies torch's API: ``fw`` is the framework's module."""

    class ConvBNNet(fw.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1, self.bn1 = fw.nn.Conv2d(CHANNELS, WIDTH, 3, padding=1), fw.nn.BatchNorm2d(WIDTH)
            self.conv2, self.bn2 = fw.nn.Conv2d(WIDTH, WIDTH, 3, padding=1), fw.nn.BatchNorm2d(WIDTH)
            self.fc = fw.nn.Linear(WIDTH, CLASSES)

        def forward(self, x, label):
            h = fw.relu(self.bn1(self.conv1(x)))
            h = fw.relu(self.bn2(self.conv2(h)) + h)
            pred = self.fc(h.mean(dim=(2, 3)))
            return {"pred": pred, "loss": fw.nn.functional.cross_entropy(pred, label)}

    def build():
        fw.manual_seed(0)  # the initial weights
        model = ConvBNNet()
        if optimizer == "sgd":
            return model, fw.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        return model, fw.optim.Adam(model.parameters(), lr=0.01)

    def state(model) -> dict[str, np.ndarray]:
        return {name: value.detach().numpy().copy() for name, value in model.state_dict().items()}

    batches = [{name: fw.from_numpy(value) for name, value in batch.items()} for batch in image_batches()]
    model, opt = build()
    backward_loop(model, batches, accumulation, opt.step, opt.zero_grad)
    want = state(model)

    model, opt = build()
    initial = state(model)
    train_with_trainer(model, batches, opt, driver, accumulation)
    assert_identical(state(model), want, initial)
