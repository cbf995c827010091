"""The backend works for a user: installed, discovered, trains and evaluates a real dataset."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import numpy as np
from sklearn.datasets import load_digits

import drivetrain
from drivetrain import Accuracy, Evaluator, Trainer
from drivetrain_numpy import SGD, ArrayLoader, LinearModel


def test_the_entry_point_is_discovered_from_the_installed_distribution():
    spec = drivetrain.available_drivers()["numpy"]
    assert spec.distribution == "drivetrain-numpy"
    assert spec.version() == importlib.metadata.version("drivetrain-numpy")
    assert drivetrain.CONTRACT_VERSION in spec.contract_versions


def test_the_command_line_check_passes():
    result = subprocess.run([sys.executable, "-m", "drivetrain._cli", "backends", "--check", "numpy"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "checks passed" in result.stdout and "FAIL" not in result.stdout


def test_digits_trains_through_the_trainer():
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    order = np.random.default_rng(0).permutation(len(x))
    train, dev = order[:1400], order[1400:]
    model = LinearModel(64, 10, loss="ce")
    trainer = Trainer(model, ArrayLoader({"x": x[train], "target": y[train]}, batch_size=32, shuffle=True),
                      SGD(model.params, model.grads, lr=0.5), driver="numpy", n_epochs=10, progress_bar=None,
                      evaluate_dataloaders={"dev": ArrayLoader({"x": x[dev], "target": y[dev]}, batch_size=128)},
                      metrics={"acc": Accuracy()}, evaluate_every=-1, monitor="acc")
    trainer.run()
    results = Evaluator(model, ArrayLoader({"x": x[dev], "target": y[dev]}, batch_size=128), {"acc": Accuracy()},
                        driver="auto", verbose=0).run()
    assert results["acc#acc"] > 0.9, results
