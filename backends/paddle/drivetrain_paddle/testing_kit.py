"""The paddle backend's kit for drivetrain's conformance checks (``drivetrain.testing``)."""

from __future__ import annotations

import paddle

from drivetrain.testing import ArrayDataset, BackendKit, linear_classifier


def paddle_kit() -> BackendKit:
    return BackendKit(
        driver="paddle",
        make_model=linear_classifier(paddle.nn.Layer, paddle.nn.Linear, paddle.nn.functional.cross_entropy,
                                     paddle.Tensor.set_value, weight_in_out=True),  # paddle's weight is [in, out]
        make_optimizer=lambda model, lr: paddle.optimizer.SGD(learning_rate=lr, parameters=model.parameters()),
        to_tensor=lambda array: paddle.to_tensor(array, place=paddle.CPUPlace()),
        random=lambda: float(paddle.rand([])),
        make_loader=lambda x, target, batch_size: paddle.io.DataLoader(ArrayDataset(x, target), batch_size=batch_size),
    )
