"""Plain SGD over a LinearModel's parameter dict."""

from __future__ import annotations

import numpy as np


class SGD:
    def __init__(self, params: dict[str, np.ndarray], grads: dict[str, np.ndarray], lr: float = 0.1) -> None:
        self.params = params
        self.grads = grads
        self.lr = lr
        self.steps = 0

    def step(self) -> None:
        for name, p in self.params.items():
            p -= self.lr * self.grads[name]
        self.steps += 1

    def zero_grad(self) -> None:
        for g in self.grads.values():
            g.fill(0.0)

    def state_dict(self) -> dict:
        return {"lr": self.lr, "steps": self.steps}

    def load_state_dict(self, state: dict) -> None:
        self.lr = float(state["lr"])
        self.steps = int(state["steps"])
