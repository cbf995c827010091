"""Entry point of the JAX backend: describes its driver without importing jax or flax.

The ``drivetrain`` entry-point group points here; the core calls :func:`drivetrain_driver_specs` during
discovery, so this module imports only the core. The driver is built by the lazy factory.
"""

from __future__ import annotations

from drivetrain import Capabilities, TensorRule, WeightLayout
from drivetrain.backend import driver_specs_hook

CAPABILITIES = Capabilities(
    precisions=("fp32", "bf16"),
    distributed=("ddp",),
    devices=("cpu", "gpu"),
    separate_backward=False,
    notes={
        "models": "flax.nnx.Module models with one nnx.Optimizer over optax (its wrt= filter says what trains; "
        "other parameters are frozen). Learning-rate schedules need optax.inject_hyperparams.",
        "step": "The loss and its gradients come from one jax.value_and_grad, compiled once per batch shape and "
        "model mode (a last, shorter batch compiles once more); gradients of an accumulation cycle are added "
        "locally and averaged across processes once, at the cycle's end.",
        "bf16": "Flax's own mixed precision: every layer whose dtype is None computes in bfloat16; parameters, "
        "gradients and optimizer state keep their dtype (float32). fp16 is refused (no loss scaling in NNX).",
        "distributed": "Data parallel on jax.distributed (gloo on CPU; tested on CPU only): nproc=N in python "
        "train.py, or python -m drivetrain_jax.run --nproc_per_node N train.py (each process joins before the "
        "script runs: JAX cannot join after its first use); gradients and batch statistics are averaged once per "
        "optimizer step; a failed or stuck peer ends the others within jax_kwargs['timeout'] (60 s).",
        "randomness": "JAX has no global generator: dropout draws from the model's nnx.Rngs, whose keys and "
        "counts checkpoints keep; seed_everything leaves them alone (seed them when building the model).",
    },
)

WEIGHT_LAYOUT = WeightLayout(
    rules=(
        TensorRule("kernel", neutral="weight", transpose=True, modules=("Linear",)),  # [in, out]
        TensorRule("kernel", neutral="weight", permute=(2, 3, 1, 0), modules=("Conv",)),  # [h, w, in, out]
        TensorRule("embedding", neutral="weight", modules=("Embed",)),
        TensorRule("scale", neutral="weight", modules=("BatchNorm", "LayerNorm", "GroupNorm")),
        TensorRule("mean", neutral="running_mean", modules=("BatchNorm",)),
        TensorRule("var", neutral="running_var", modules=("BatchNorm",)),
    ),
    lacks=("num_batches_tracked",),  # flax's BatchNorm counts no batches
)
"""How flax NNX model files differ from the neutral (torch) layout, for moving weights between frameworks."""

# contract_versions: what this release implements; never CONTRACT_VERSION (that follows the core)
drivetrain_driver_specs = driver_specs_hook("jax", CAPABILITIES, contract_versions=(1,), model_modules=("flax",),
                                            weight_layout=WEIGHT_LAYOUT)
"""The jax driver's description: ``driver="auto"`` claims flax models; no seed function (JAX keeps no global
random state: randomness lives in the model's ``nnx.Rngs``)."""
