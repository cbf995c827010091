"""A linear model whose gradients are written by hand, so no autograd framework is needed."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


class NumpyLoss:
    """A scalar loss that knows how to push its gradient into the model (``backward``)."""

    __slots__ = ("value", "_push", "_scale")

    def __init__(self, value: float, push: Callable[[float], None], scale: float = 1.0) -> None:
        self.value = float(value)
        self._push = push
        self._scale = scale

    def backward(self) -> None:
        self._push(self._scale)

    def __truediv__(self, k: float) -> NumpyLoss:
        return NumpyLoss(self.value / k, self._push, self._scale / k)

    def __mul__(self, k: float) -> NumpyLoss:
        return NumpyLoss(self.value * k, self._push, self._scale * k)

    def __float__(self) -> float:
        return self.value

    def __repr__(self) -> str:
        return f"NumpyLoss({self.value:.6g})"


class LinearModel:
    """``y = x @ weight + bias`` with a mean-squared-error (``loss="mse"``) or softmax cross-entropy loss.

    ``forward(x, target)`` returns ``{"loss": NumpyLoss, "pred": ndarray}``; gradients
    accumulate into ``self.grads`` when the loss's ``backward`` runs.
    """

    def __init__(self, in_features: int, out_features: int, loss: str = "mse", seed: int = 0,
                 noise: float = 0.0) -> None:
        if loss not in ("mse", "ce"):
            raise ValueError(f"loss={loss!r}; use 'mse' or 'ce'")
        rng = np.random.default_rng(seed)
        self.params = {
            "weight": (rng.standard_normal((in_features, out_features)) * 0.1).astype(np.float32),
            "bias": np.zeros(out_features, dtype=np.float32),
        }
        self.grads = {k: np.zeros_like(v) for k, v in self.params.items()}
        self.loss_kind = loss
        self.noise = noise  # input noise drawn from numpy's global RNG in training, like dropout
        self.training = True

    def parameters(self) -> dict[str, np.ndarray]:
        return self.params

    def forward(self, x: np.ndarray, target: np.ndarray) -> dict:
        x = np.asarray(x, dtype=np.float32)
        if self.noise and self.training:
            x = x + np.random.standard_normal(x.shape).astype(np.float32) * self.noise
        pred = x @ self.params["weight"] + self.params["bias"]
        n = x.shape[0]
        if self.loss_kind == "mse":
            target = np.asarray(target, dtype=np.float32).reshape(pred.shape)
            diff = pred - target
            value = float(np.mean(diff**2))
            dpred = 2.0 * diff / diff.size
        else:
            target = np.asarray(target).astype(np.int64).reshape(-1)
            shifted = pred - pred.max(axis=1, keepdims=True)
            probs = np.exp(shifted)
            probs /= probs.sum(axis=1, keepdims=True)
            value = float(-np.mean(np.log(probs[np.arange(n), target] + 1e-12)))
            dpred = probs.copy()
            dpred[np.arange(n), target] -= 1.0
            dpred /= n

        def push(scale: float) -> None:
            self.grads["weight"] += (x.T @ dpred * scale).astype(np.float32)
            self.grads["bias"] += (dpred.sum(axis=0) * scale).astype(np.float32)

        return {"loss": NumpyLoss(value, push), "pred": pred}

    __call__ = forward
