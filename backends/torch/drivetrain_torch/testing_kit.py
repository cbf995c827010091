"""The torch backend's kit for drivetrain's conformance checks (``drivetrain.testing``)."""

from __future__ import annotations

import torch

from drivetrain.testing import CLASSES, IN_FEATURES, BackendKit


class Classifier(torch.nn.Module):
    """One linear layer with fixed initial weights, returning the loss and the logits."""

    def __init__(self) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.linear = torch.nn.Linear(IN_FEATURES, CLASSES)
        with torch.no_grad():
            self.linear.weight.copy_(torch.randn(CLASSES, IN_FEATURES, generator=generator) * 0.3)
            self.linear.bias.zero_()

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
        pred = self.linear(x)
        return {"loss": torch.nn.functional.cross_entropy(pred, target), "pred": pred}


def torch_kit() -> BackendKit:
    return BackendKit(
        driver="torch",
        make_model=Classifier,
        make_optimizer=lambda model, lr: torch.optim.SGD(model.parameters(), lr=lr),
        to_tensor=torch.from_numpy,
        random=lambda: float(torch.rand(())),
    )
