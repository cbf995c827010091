"""What users of Keras, Lightning and the Hugging Face Trainer type first, with torch: each is refused with the
fix in torch's words, or accepted as what it means, and the fix works."""

from __future__ import annotations

import re

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from drivetrain import Accuracy, BatchMismatchError, DriverError, Trainer

TORCH_LOADER = ("torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.as_tensor(x), torch.as_tensor(y)), "
                "batch_size=32, shuffle=True)")


class Classifier(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 2)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> dict:
        logits = self.fc(x)
        return {"loss": torch.nn.functional.cross_entropy(logits, target), "pred": logits}


class Masked(Classifier):
    """A forward with a parameter between the input and the label, as Hugging Face models have."""

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, target: torch.Tensor) -> dict:  # type: ignore[override]
        return super().forward(x if mask is None else x * mask, target)


def _data(n: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(n, 4, generator=torch.Generator().manual_seed(0))
    return x, (x[:, 0] > 0).long()


def _trainer(data, model: torch.nn.Module | None = None, optimizers=None, **options) -> Trainer:
    model = model or Classifier()
    optimizers = optimizers or torch.optim.SGD(model.parameters(), lr=0.5)
    return Trainer(model, data, optimizers, driver="torch", device="cpu", progress_bar=None,
                   n_epochs=options.pop("n_epochs", 1), **options)


# --------------------------------------------------- the data itself where a dataloader belongs (Keras' fit(x, y))
@pytest.mark.parametrize(("make", "described"), [
    (lambda x, y: x.numpy(), "a numpy array of shape (64, 4)"),
    (lambda x, y: x, "a torch tensor of shape (64, 4)"),
    (lambda x, y: {"x": x.numpy(), "target": y.numpy()}, "a dict of arrays {'x': (64, 4), 'target': (64,)}"),
    (lambda x, y: {"x": x, "target": y}, "a dict of arrays {'x': (64, 4), 'target': (64,)}"),
])
def test_arrays_and_tensors_as_dataloaders_are_refused_at_construction_in_torchs_words(make, described) -> None:
    x, y = _data()
    with pytest.raises(DriverError) as caught:
        _trainer(make(x, y))
    message = str(caught.value)
    assert message.startswith(f"train_dataloader={described} is the data itself, not a dataloader")
    assert TORCH_LOADER in message
    with pytest.raises(DriverError, match="^" + re.escape(f"evaluate_dataloaders['dev']={described} is the data")):
        _trainer(DataLoader(TensorDataset(x, y), batch_size=32), metrics={"acc": Accuracy()},
                 evaluate_dataloaders={"dev": make(x, y)})
    # the fix, as the message writes it (x and y as numpy arrays)
    x, y = x.numpy(), y.numpy()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.as_tensor(x), torch.as_tensor(y)),
                                         batch_size=32, shuffle=True)
    trainer = _trainer(loader, n_epochs=20, metrics={"acc": Accuracy()}, evaluate_dataloaders={"dev": loader})
    trainer.run(num_eval_sanity_batch=0)
    assert trainer.evaluate()["acc#acc#dev"] > 0.9


# ------------------------------------------------------ a tuple batch shorter than forward's parameter list
def test_a_two_value_batch_for_three_parameters_names_every_parameter_and_which_gets_no_value() -> None:
    x, y = _data()
    loader = DataLoader(TensorDataset(x, y), batch_size=32)
    with pytest.raises(BatchMismatchError) as caught:
        _trainer(loader, Masked()).run()
    message = str(caught.value)
    assert "the batch is a list of 2 values but Masked.forward(x, mask, target) takes 3" in message
    assert "cannot be matched by position: x would get batch[0], mask batch[1], and target no value" in message
    assert "input_mapping=lambda batch: {'x': batch[0], 'mask': None, 'target': batch[1]}" in message
    assert "'mask': batch[1]" not in message  # the label is not offered to the mask
    # the fix, as the message writes it
    model = Masked()
    trainer = _trainer(loader, model, n_epochs=20,
                       input_mapping=lambda batch: {"x": batch[0], "mask": None, "target": batch[1]})
    trainer.run()
    assert (model.fc(x).argmax(1) == y).float().mean() > 0.9


def test_a_batch_longer_than_the_parameter_list_says_which_value_goes_nowhere() -> None:
    x, y = _data()
    loader = DataLoader(TensorDataset(x, torch.ones_like(x), y), batch_size=32)
    with pytest.raises(BatchMismatchError) as caught:
        _trainer(loader).run()
    message = str(caught.value)
    assert "the batch is a list of 3 values but Classifier.forward(x, target) takes 2" in message
    assert "cannot be matched by position: x would get batch[0], target batch[1], and batch[2] goes to no parameter" in message
    assert "input_mapping=lambda batch: {'x': batch[0], 'target': batch[2]}" in message
    _trainer(loader, input_mapping=lambda batch: {"x": batch[0], "target": batch[2]}).run()


# ------------------------------------------------------------ precision="bf16-mixed", an optimizer class
def test_lightnings_precision_names_are_accepted() -> None:
    x, y = _data()
    loader = DataLoader(TensorDataset(x, y), batch_size=32)
    assert _trainer(loader, precision="bf16-mixed").precision == "bf16"
    assert _trainer(loader, precision="bf16-mixed").driver.precision == "bf16"
    assert _trainer(loader, precision="32-true").precision == "fp32"


def test_an_optimizer_class_is_named_by_its_public_path() -> None:
    x, y = _data()
    loader = DataLoader(TensorDataset(x, y), batch_size=32)
    with pytest.raises(DriverError, match=r"^optimizers=torch\.optim\.SGD is a class, not an optimizer; create one "
                                          r"from the model's parameters, e\.g\. torch\.optim\.AdamW\("):
        _trainer(loader, optimizers=torch.optim.SGD)
    with pytest.raises(DriverError, match=r"^optimizers\[1\]=torch\.optim\.SGD is a class"):
        model = Classifier()
        _trainer(loader, model, optimizers=[torch.optim.SGD(model.parameters(), lr=0.1), torch.optim.SGD])
    model = Classifier()
    _trainer(loader, model, optimizers=torch.optim.AdamW(model.parameters(), lr=1e-3)).run()
