"""What a backend gives the conformance suite: a tiny classifier, its optimizer and tensors.

The kit is the only backend-specific part of the suite; everything else talks to the
driver through the contract. A backend ships its kit in its package and names it in
its :class:`~drivetrain.DriverSpec` (``testing_kit="pkg.module:function"``), so
``drivetrain backends --check NAME`` and :class:`~drivetrain.testing.ContractSuite`
find it by the backend's name.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

IN_FEATURES = 4
"""Input width of the kit's classifier."""
CLASSES = 3
"""Number of classes of the kit's classifier."""


def classification_arrays(n: int = 60, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``(x float32 [n, IN_FEATURES], target int64 [n])``: well-separated clusters a linear model learns."""
    centers = np.random.default_rng(99).standard_normal((CLASSES, IN_FEATURES)) * 3
    rng = np.random.default_rng(seed)
    target = rng.integers(0, CLASSES, n)
    x = (centers[target] + rng.standard_normal((n, IN_FEATURES)) * 0.5).astype(np.float32)
    return x, target.astype(np.int64)


def classifier_weights() -> tuple[np.ndarray, np.ndarray]:
    """The kit classifier's fixed initial weight (float32 ``[CLASSES, IN_FEATURES]``) and bias (zeros)."""
    weight = np.random.default_rng(0).standard_normal((CLASSES, IN_FEATURES)).astype(np.float32) * 0.3
    return weight, np.zeros(CLASSES, np.float32)


def linear_classifier(base: type, linear: Callable[[int, int], Any], cross_entropy: Callable[[Any, Any], Any],
                      assign: Callable[[Any, np.ndarray], Any], *, forward: str = "forward",
                      weight_in_out: bool = False) -> type:
    """A ``make_model`` for :class:`BackendKit`: a subclass of the framework's module class ``base``.

    Its one layer ``linear(IN_FEATURES, CLASSES)`` gets :func:`classifier_weights`, each
    written by ``assign(parameter, array)`` (``weight_in_out``: the framework stores the
    weight ``[in, out]``, so it is transposed first); its method ``forward`` (``"execute"``
    in jittor) takes ``(x, target)`` and returns ``{"loss": cross_entropy(pred, target), "pred": pred}``.
    """

    class Classifier(base):  # type: ignore[misc]  # the framework's module class
        """One linear layer with fixed initial weights, returning the loss and the logits."""

        def __init__(self) -> None:
            super().__init__()
            self.linear = linear(IN_FEATURES, CLASSES)
            weight, bias = classifier_weights()
            assign(self.linear.weight, np.ascontiguousarray(weight.T) if weight_in_out else weight)
            assign(self.linear.bias, bias)

        def run(self, x: Any, target: Any) -> dict[str, Any]:
            pred = self.linear(x)
            return {"loss": cross_entropy(pred, target), "pred": pred}

    setattr(Classifier, forward, Classifier.run)
    return Classifier


@dataclass
class BackendKit:
    """The three small factories a backend author writes to run the conformance suite.

    - ``make_model()``: a new classifier with the SAME initial weights on every call,
      whose forward takes ``(x, target)`` and returns ``{"loss": cross-entropy, "pred": logits}``
      (``IN_FEATURES`` inputs, ``CLASSES`` outputs; a single linear layer is enough).
    - ``make_optimizer(model, lr)``: plain SGD over the model's parameters.
    - ``to_tensor(array)``: a numpy array as a CPU tensor of the framework.
    - ``random()``: one float drawn from the framework's global generator (the one
      ``Driver.seed`` seeds and ``Driver.rng_state`` captures).
    """

    driver: str
    make_model: Callable[[], Any]
    make_optimizer: Callable[[Any, float], Any]
    to_tensor: Callable[[np.ndarray], Any]
    random: Callable[[], float] | None = None
    framework: str = ""
    """The framework's top-level module; defaults to ``driver``."""
    make_loader: Callable[[np.ndarray, np.ndarray, int], Any] | None = None
    """The framework's own dataloader over ``(x, target)`` arrays with that ``batch_size``, yielding
    ``{"x", "target"}`` batches (e.g. a ``DataLoader`` over :class:`ArrayDataset`): a driver that reads a
    dataloader's ``batch_size`` is checked with it. None: lists of batches (no ``batch_size`` to read)."""
    train_batch_options: Callable[[int], Mapping[str, Any]] | None = None
    """Trainer options that bind the driver to the train dataloader's batch size, for an engine that has one
    (DeepSpeed's ``train_micro_batch_size_per_gpu``): the check that evaluates and predicts with other batch sizes
    uses them, since evaluation and prediction must not be held to that size."""
    waived: Mapping[str, str] = field(default_factory=dict)
    """Checks the driver cannot meet by design, ``{check name: why}`` (an engine that cannot checkpoint inside
    a gradient-accumulation cycle): reported as waived with the reason, never as passed; an unknown name is refused."""

    def __post_init__(self) -> None:
        if not self.framework:
            self.framework = self.driver

    def no_checkpoint_inside_a_cycle(self, why: str) -> BackendKit:
        """This kit with the two checks that checkpoint inside a gradient-accumulation cycle waived for ``why``
        (an engine that holds a cycle's gradients itself: FSDP, DeepSpeed ZeRO)."""
        return replace(self, waived={
            **self.waived, "gradient_state_round_trip": why,
            "exact_resume_through_the_trainer": f"it checkpoints every 5 batches with accumulation_steps=2; {why}"})

    def loader(self, batch_size: int, n: int = 60, seed: int = 0) -> Any:
        """``n`` samples in batches of ``batch_size`` through :attr:`make_loader`, else as :meth:`batches`."""
        if self.make_loader is None:
            return self.batches(n, batch_size, seed)
        return self.make_loader(*classification_arrays(n, seed), batch_size)

    def batches(self, n: int = 60, batch_size: int = 10, seed: int = 0) -> list[dict[str, Any]]:
        """``n`` samples as a list of ``{"x", "target"}`` batches of the framework's tensors."""
        x, y = classification_arrays(n, seed)
        return [{"x": self.to_tensor(x[i:i + batch_size]), "target": self.to_tensor(y[i:i + batch_size])}
                for i in range(0, n, batch_size)]


class ArrayDataset:
    """A map-style dataset over ``(x, target)`` arrays: item ``i`` is ``{"x": x[i], "target": target[i]}``, each
    passed through ``convert`` (default: left as numpy, for a framework whose dataloader collates numpy)."""

    def __init__(self, x: np.ndarray, target: np.ndarray, convert: Callable[[np.ndarray], Any] = np.asarray) -> None:
        self.x, self.target, self.convert = x, target, convert

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {"x": self.convert(self.x[index]), "target": self.convert(np.asarray(self.target[index]))}


def torch_style_kit(driver: str, framework: Any, to_tensor: Callable[[np.ndarray], Any],
                    random: Callable[[], float]) -> BackendKit:
    """The kit of a framework with torch's API, ``framework`` being its module (torch itself, oneflow, ...).

    It uses ``framework.nn.Module``, ``nn.Linear``, ``nn.functional.cross_entropy``,
    ``optim.SGD(parameters, lr=lr)``, ``parameter.data.copy_(tensor)`` and
    ``utils.data.DataLoader``; ``to_tensor`` and ``random`` are :class:`BackendKit`'s.
    """
    nn = framework.nn

    def make_loader(x: np.ndarray, target: np.ndarray, batch_size: int) -> Any:
        return framework.utils.data.DataLoader(ArrayDataset(x, target, to_tensor), batch_size=batch_size)

    return BackendKit(
        driver=driver,
        make_model=linear_classifier(nn.Module, nn.Linear, nn.functional.cross_entropy,
                                     lambda param, array: param.data.copy_(to_tensor(array))),
        make_optimizer=lambda model, lr: framework.optim.SGD(model.parameters(), lr=lr),
        to_tensor=to_tensor,
        random=random,
        make_loader=make_loader,
    )


def kit_for(backend: str) -> BackendKit:
    """The kit the installed backend ``backend`` declares in its DriverSpec (``testing_kit=``)."""
    from .._common import DriverNotFoundError
    from ..backend import available_drivers

    specs = available_drivers()
    if backend not in specs:
        raise DriverNotFoundError(
            f"backend={backend!r} is not installed; installed: {', '.join(sorted(specs)) or 'none'}."
        )
    spec = specs[backend]
    if not spec.testing_kit:
        raise DriverNotFoundError(
            f"backend {backend!r} ({spec.distribution or 'unknown distribution'}) declares no testing kit; its "
            "DriverSpec needs testing_kit='package.module:function' returning a drivetrain.testing.BackendKit."
        )
    module_name, _, attr = spec.testing_kit.partition(":")
    kit = getattr(importlib.import_module(module_name), attr)()
    if not isinstance(kit, BackendKit):
        raise TypeError(f"{spec.testing_kit} returned {type(kit).__name__}, not a drivetrain.testing.BackendKit.")
    return kit
