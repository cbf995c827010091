"""The data-parallel layout's refusals, without starting processes: each names what starts a run instead."""

from __future__ import annotations

import subprocess
import sys

import optax
import pytest
from flax import nnx

from drivetrain import Trainer
from drivetrain.backend import DriverError

from ..conftest import MLP, logits_loss, regression_batches

pytestmark = pytest.mark.jax


def build(**options) -> Trainer:
    model = MLP(16, 32, 4, rngs=nnx.Rngs(0))
    return Trainer(model, regression_batches(2), nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param), driver="jax",
                   loss_fn=logits_loss, progress_bar=None, **options)


def test_a_launcher_environment_without_jax_distributed_names_the_module_that_joins_first(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(DriverError, match=r"WORLD_SIZE=2 is set, but JAX runs as one process.*python -m "
                                          r"drivetrain_jax.run train.py"):
        build()


def test_nproc_needs_a_script_to_run_again_and_device_lists_are_refused():
    with pytest.raises(DriverError, match=r"runs under pytest.*python -m drivetrain_jax.run --nproc_per_node N"):
        build(nproc=2)
    with pytest.raises(DriverError, match=r"takes no device list; pass nproc=N"):
        build(device=["cpu", "cpu"])
    with pytest.raises(DriverError, match=r"jax_kwargs \['timeout'\] apply to several processes only"):
        build(jax_kwargs={"timeout": 5})


def test_the_run_module_says_how_it_is_used():
    done = subprocess.run([sys.executable, "-m", "drivetrain_jax.run"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "usage: python -m drivetrain_jax.run [--nproc_per_node N]" in done.stderr
