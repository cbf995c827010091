"""The errors a newcomer meets in the first hour with torch, through the public API, and the fixes they suggest."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from drivetrain import Accuracy, BatchMismatchError, DriverError, Trainer


class Logits(torch.nn.Module):
    """A model as a tutorial writes it: ``forward(self, x)`` returns logits, no loss."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


def _data(n: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=generator)
    return x, (x[:, 0] > 0).long()


def _trainer(model: torch.nn.Module, data, **options) -> Trainer:
    return Trainer(model, data, torch.optim.SGD(model.parameters(), lr=0.5), driver="torch", device="cpu",
                   progress_bar=None, n_epochs=options.pop("n_epochs", 1), **options)


def _message(error: type[Exception], model: torch.nn.Module, data, **options) -> str:
    """The message of the ``error`` that training ``model`` on ``data`` raises."""
    with pytest.raises(error) as caught:
        _trainer(model, data, **options).run()
    return str(caught.value)


def test_logits_without_loss_fn_name_loss_fn_and_the_suggestion_trains() -> None:
    x, y = _data()
    batches = [{"x": x[i:i + 32], "label": y[i:i + 32]} for i in range(0, 64, 32)]
    model = Logits()
    message = _message(DriverError, model, batches)
    assert "has shape (32, 2); backward needs a single number" in message
    assert "looks like predictions" in message
    assert "loss_fn=lambda outputs, batch: torch.nn.functional.cross_entropy(outputs, batch['label'])" in message
    assert "output_mapping=" in message
    assert message.index("loss_fn=") < message.index("loss.mean()")  # the fix for logits comes first
    # the suggested loss_fn, as written, trains the model
    trainer = _trainer(model, batches, n_epochs=20,
                       loss_fn=lambda outputs, batch: torch.nn.functional.cross_entropy(outputs, batch["label"]))
    trainer.run()
    accuracy = (model(x).argmax(1) == y).float().mean().item()
    assert accuracy > 0.9


def test_a_loss_per_sample_is_told_to_reduce_first() -> None:
    class PerSample(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(4, 2)

        def forward(self, x: torch.Tensor, label: torch.Tensor) -> dict:
            return {"loss": torch.nn.functional.cross_entropy(self.fc(x), label, reduction="none")}

    x, y = _data(32)
    message = _message(DriverError, PerSample(), [{"x": x, "label": y}])
    assert "has shape (32,)" in message and "looks like predictions" not in message
    assert message.index("loss.mean()") < message.index("loss_fn=")


def test_tuple_batches_for_a_one_argument_forward_name_input_mapping_and_it_works() -> None:
    x, y = _data()
    loader = DataLoader(TensorDataset(x, y), batch_size=32)
    model = Logits()
    message = _message(BatchMismatchError, model, loader)
    assert "Logits.forward() raised TypeError" in message
    assert "takes one parameter, so it received the whole list as 'x'" in message
    assert "input_mapping=lambda batch: {'x': batch[0], 'target': batch[1]}" in message
    # the suggestion, with a loss_fn reading 'target', trains and evaluates
    trainer = _trainer(model, loader, n_epochs=20,
                       input_mapping=lambda batch: {"x": batch[0], "target": batch[1]},
                       loss_fn=lambda outputs, batch: torch.nn.functional.cross_entropy(outputs, batch["target"]),
                       metrics={"acc": Accuracy()}, evaluate_dataloaders=loader, evaluate_every=-20)
    trainer.run()
    assert trainer.evaluator.run()["acc#acc"] > 0.9


def test_numpy_batches_name_the_conversion_and_the_converted_batches_train() -> None:
    x, y = _data(32)
    numpy_batches = [{"x": x.numpy(), "label": y.numpy()}]
    model = Logits()
    loss_fn = lambda outputs, batch: torch.nn.functional.cross_entropy(outputs, batch["label"])  # noqa: E731
    message = _message(BatchMismatchError, model, numpy_batches, loss_fn=loss_fn)
    assert "The batch holds values that are not torch tensors: batch['x'] (numpy.ndarray)" in message
    assert "in the Dataset's __getitem__ or in the DataLoader's collate_fn (e.g. torch.as_tensor(array))" in message
    assert "Logits.forward() raised TypeError" in message  # the framework's own words stay in the message
    converted = [{k: torch.as_tensor(v) for k, v in batch.items()} for batch in numpy_batches]
    _trainer(model, converted, loss_fn=loss_fn).run()


def test_python_lists_and_numpy_tuples_get_both_fixes() -> None:
    x, y = _data(4)
    message = _message(BatchMismatchError, Logits(), [(x.numpy(), y.numpy())])
    assert "batch[0] (numpy.ndarray), batch[1] (numpy.ndarray)" in message
    assert "Also, the batch is a tuple of 2 values" in message
    with pytest.raises(BatchMismatchError, match=r"batch\['x'\] \(a python list of numbers\)"):
        _trainer(Logits(), [{"x": [0.1, 0.2, 0.3, 0.4]}]).run()


def test_a_model_error_unrelated_to_the_batch_is_left_alone() -> None:
    class Broken(Logits):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise TypeError("a bug in the model")

    x, y = _data(4)
    with pytest.raises(TypeError, match="^a bug in the model$"):
        _trainer(Broken(), [{"x": x, "label": y}]).run()
