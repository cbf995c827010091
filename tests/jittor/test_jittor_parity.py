"""torch and jittor, driven by the same Trainer, train the same MLP to the same parameters.

Same initial weights (torch's, copied into jittor; both store a Linear's weight as
[out, in]), the same batches in the same order, fp32 and plain SGD, 100 steps each.
The remaining differences are float rounding of two different kernel libraries.
"""

from __future__ import annotations

import numpy as np
import pytest

from drivetrain import Event, Trainer

from .conftest import jt

torch = pytest.importorskip("torch")
pytest.importorskip("drivetrain_torch")

STEPS, BATCH, LR = 100, 16, 0.1
SIZES = (10, 32, 32, 4)


class TorchMLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(a, b) for a, b in zip(SIZES, SIZES[1:], strict=False))

    def forward(self, x, target):
        for i, layer in enumerate(self.layers):
            x = layer(x) if i == len(self.layers) - 1 else torch.tanh(layer(x))
        return {"loss": torch.nn.functional.cross_entropy(x, target)}


class JittorMLP(jt.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = jt.nn.ModuleList([jt.nn.Linear(a, b) for a, b in zip(SIZES, SIZES[1:], strict=False)])

    def execute(self, x, target):
        for i, layer in enumerate(self.layers):
            x = layer(x) if i == len(self.layers) - 1 else jt.tanh(layer(x))
        return {"loss": jt.nn.cross_entropy_loss(x, target)}


def _data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(42)
    x = rng.standard_normal((STEPS * BATCH, SIZES[0])).astype(np.float32)
    w = rng.standard_normal((SIZES[0], SIZES[-1])).astype(np.float32)
    return x, (x @ w).argmax(axis=1).astype(np.int64)


def _relative(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(a))


@pytest.mark.jittor
@pytest.mark.torch
def test_same_mlp_same_data_same_parameters_after_100_sgd_steps() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    torch_model = TorchMLP()
    jittor_model = JittorMLP()
    for t_layer, j_layer in zip(torch_model.layers, jittor_model.layers, strict=True):
        j_layer.weight.update(jt.array(t_layer.weight.detach().numpy().copy()))
        j_layer.bias.update(jt.array(t_layer.bias.detach().numpy().copy()))
    x, y = _data()
    order = np.random.default_rng(7).permutation(len(x))  # one shuffled order, fed to both
    torch_batches = [{"x": torch.from_numpy(x[idx]), "target": torch.from_numpy(y[idx])}
                     for idx in np.split(order, STEPS)]
    jittor_batches = [{"x": x[idx], "target": y[idx].astype(np.int32)} for idx in np.split(order, STEPS)]  # numpy

    losses: dict[str, list[float]] = {"torch": [], "jittor": []}
    for name, model, batches, opt in (
        ("torch", torch_model, torch_batches, torch.optim.SGD(torch_model.parameters(), lr=LR)),
        ("jittor", jittor_model, jittor_batches, jt.optim.SGD(jittor_model.parameters(), lr=LR)),
    ):
        trainer = Trainer(model, batches, opt, driver=name, device="cpu", n_epochs=1, progress_bar=None)
        trainer.add_callback_fn(Event.on_before_backward(),
                                lambda t, out, name=name: losses[name].append(float(t.driver.tensor_to_numpy(
                                    out["loss"]))))
        trainer.run(num_eval_sanity_batch=0)
        assert trainer.global_forward_batches == STEPS

    assert losses["jittor"][-1] < 0.6 * losses["jittor"][0]  # it did learn
    np.testing.assert_allclose(losses["jittor"], losses["torch"], rtol=1e-5)
    worst = 0.0
    for t_layer, j_layer in zip(torch_model.layers, jittor_model.layers, strict=True):
        for t_param, j_param in ((t_layer.weight.detach().numpy(), j_layer.weight.numpy()),
                                 (t_layer.bias.detach().numpy(), j_layer.bias.numpy())):
            worst = max(worst, _relative(t_param, j_param))
    print(f"\nlargest relative difference of a parameter (torch vs jittor, {STEPS} SGD steps): {worst:.2e}")
    assert worst <= 1e-5
