"""torch and paddle, driven by the same Trainer, train the same MLP to the same parameters.

Same initial weights (torch's, copied into paddle; paddle's Linear stores its weight
as [in, out], torch's as [out, in]), the same batches in the same order, fp32 and
plain SGD, 100 steps each. The remaining differences are float rounding of two
different kernel libraries.
"""

from __future__ import annotations

import numpy as np
import pytest

from drivetrain import Event, Trainer

from .conftest import paddle

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


class PaddleMLP(paddle.nn.Layer):
    def __init__(self) -> None:
        super().__init__()
        self.layers = paddle.nn.LayerList([paddle.nn.Linear(a, b) for a, b in zip(SIZES, SIZES[1:], strict=False)])

    def forward(self, x, target):
        for i, layer in enumerate(self.layers):
            x = layer(x) if i == len(self.layers) - 1 else paddle.tanh(layer(x))
        return {"loss": paddle.nn.functional.cross_entropy(x, target)}


def _data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(42)
    x = rng.standard_normal((STEPS * BATCH, SIZES[0])).astype(np.float32)
    w = rng.standard_normal((SIZES[0], SIZES[-1])).astype(np.float32)
    return x, (x @ w).argmax(axis=1).astype(np.int64)


def _relative(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(a))


@pytest.mark.paddle
@pytest.mark.torch
def test_same_mlp_same_data_same_parameters_after_100_sgd_steps() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    torch_model = TorchMLP()
    paddle_model = PaddleMLP()
    with torch.no_grad():
        for t_layer, p_layer in zip(torch_model.layers, paddle_model.layers, strict=True):
            p_layer.weight.set_value(t_layer.weight.numpy().T.copy())
            p_layer.bias.set_value(t_layer.bias.numpy().copy())
    x, y = _data()
    order = np.random.default_rng(7).permutation(len(x))  # one shuffled order, fed to both
    torch_batches = [{"x": torch.from_numpy(x[idx]), "target": torch.from_numpy(y[idx])}
                     for idx in np.split(order, STEPS)]
    paddle_batches = [{"x": x[idx], "target": y[idx]} for idx in np.split(order, STEPS)]  # numpy: converted

    losses: dict[str, list[float]] = {"torch": [], "paddle": []}
    for name, model, batches, opt in (
        ("torch", torch_model, torch_batches, torch.optim.SGD(torch_model.parameters(), lr=LR)),
        ("paddle", paddle_model, paddle_batches, paddle.optimizer.SGD(learning_rate=LR,
                                                                      parameters=paddle_model.parameters())),
    ):
        trainer = Trainer(model, batches, opt, driver=name, device="cpu", n_epochs=1, progress_bar=None)
        trainer.add_callback_fn(Event.on_before_backward(),
                                lambda t, out, name=name: losses[name].append(float(t.driver.tensor_to_numpy(
                                    out["loss"]))))
        trainer.run(num_eval_sanity_batch=0)
        assert trainer.global_forward_batches == STEPS

    assert losses["paddle"][-1] < 0.6 * losses["paddle"][0]  # it did learn
    np.testing.assert_allclose(losses["paddle"], losses["torch"], rtol=1e-5)
    worst = 0.0
    for t_layer, p_layer in zip(torch_model.layers, paddle_model.layers, strict=True):
        for t_param, p_param in ((t_layer.weight.detach().numpy().T, p_layer.weight.numpy()),
                                 (t_layer.bias.detach().numpy(), p_layer.bias.numpy())):
            worst = max(worst, _relative(t_param, p_param))
    print(f"\nlargest relative difference of a parameter (torch vs paddle, {STEPS} SGD steps): {worst:.2e}")
    assert worst <= 1e-5
