"""Keras' and Lightning's habits with paddle: the data itself as a dataloader and an optimizer class are refused in
paddle's words, and the fix the message shows trains."""

from __future__ import annotations

import numpy as np
import pytest

from drivetrain import DriverError, Trainer

from .conftest import TinyNet, paddle

PADDLE_LOADER = ("paddle.io.DataLoader(paddle.io.TensorDataset([paddle.to_tensor(x), paddle.to_tensor(y)]), "
                 "batch_size=32, shuffle=True)")


def _data() -> tuple[np.ndarray, np.ndarray]:
    x = np.random.default_rng(0).standard_normal((64, 4)).astype(np.float32)
    return x, (x[:, 0] > 0).astype(np.int64)


def _trainer(model: TinyNet, data, optimizers=None, **options) -> Trainer:
    optimizers = optimizers or paddle.optimizer.SGD(learning_rate=0.5, parameters=model.parameters())
    return Trainer(model, data, optimizers, driver="paddle", device="cpu", progress_bar=None, **options)


@pytest.mark.parametrize(("as_paddle", "described"), [(True, "a paddle tensor of shape (64, 4)"),
                                                      (False, "a numpy array of shape (64, 4)")])
def test_the_data_itself_as_train_dataloader_names_paddles_loader_and_the_fix_trains(model, as_paddle, described):
    x, y = _data()
    with pytest.raises(DriverError) as caught:
        _trainer(model, paddle.to_tensor(x) if as_paddle else x)
    message = str(caught.value)
    assert message.startswith(f"train_dataloader={described} is the data itself, not a dataloader")
    assert PADDLE_LOADER in message
    loader = paddle.io.DataLoader(paddle.io.TensorDataset([paddle.to_tensor(x), paddle.to_tensor(y)]),
                                  batch_size=32, shuffle=True)
    trainer = _trainer(model, loader, n_epochs=30)
    trainer.run()
    assert (model(paddle.to_tensor(x))["logits"].argmax(1).numpy() == y).mean() > 0.9


def test_an_optimizer_class_is_named_as_paddle_exports_it(model):
    with pytest.raises(DriverError, match=r"^optimizers=paddle\.optimizer\.SGD is a class, not an optimizer"):
        _trainer(model, [], optimizers=paddle.optimizer.SGD)
