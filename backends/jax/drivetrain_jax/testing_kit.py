"""The jax driver's kit for drivetrain's conformance checks (``drivetrain backends --check jax``).

JAX has no global random generator: the kit's ``random`` draws from the ``nnx.Rngs`` of the model it built last,
the generator a model's dropout uses, which the driver's ``seed``, ``rng_state`` and ``load_rng_state`` act on.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from drivetrain.testing import CLASSES, IN_FEATURES, ArrayDataset, BackendKit, classifier_weights

from .data import DataLoader


def jax_kit() -> BackendKit:
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    class Classifier(nnx.Module):
        """One nnx.Linear (its kernel [in, out]) with the kit's fixed initial weights, returning loss and logits."""

        def __init__(self) -> None:
            weight, bias = classifier_weights()
            self.linear = nnx.Linear(IN_FEATURES, CLASSES, rngs=nnx.Rngs(0))
            self.linear.kernel.set_value(jnp.asarray(weight.T))
            self.linear.bias.set_value(jnp.asarray(bias))
            self.rngs = nnx.Rngs(0)  # the generator in-model randomness (dropout) would draw from

        def __call__(self, x: Any, target: Any) -> dict[str, Any]:
            pred = self.linear(x)
            return {"loss": optax.softmax_cross_entropy_with_integer_labels(pred, target).mean(), "pred": pred}

    built: list[Any] = []

    def make_model() -> Any:
        built[:] = [Classifier()]
        return built[0]

    def make_optimizer(model: Any, lr: float) -> Any:
        return nnx.Optimizer(model, optax.inject_hyperparams(optax.sgd)(learning_rate=lr), wrt=nnx.Param)

    def make_loader(x: np.ndarray, target: np.ndarray, batch_size: int) -> DataLoader:
        return DataLoader(ArrayDataset(x, target), batch_size=batch_size)

    return BackendKit(driver="jax", make_model=make_model, make_optimizer=make_optimizer, to_tensor=jnp.asarray,
                      random=lambda: float(jax.random.uniform(built[-1].rngs())), make_loader=make_loader)
