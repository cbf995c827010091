"""Entry point of the DeepSpeed engine: describes ``driver="deepspeed"`` without importing torch or deepspeed.

The ``drivetrain`` entry-point group points here; the core calls :func:`drivetrain_driver_specs`
during discovery, so this module imports only the core. The driver is built by the lazy
``factory`` on top of drivetrain-torch's extension API.
"""

from __future__ import annotations

from drivetrain import Capabilities
from drivetrain.backend import driver_specs_hook

INSTALL = ('pip install "deepspeed>=0.16" (from a drivetrain checkout: pip install -c constraints.txt -e . '
           "-e backends/torch -e backends/deepspeed)")
"""What driver='deepspeed' needs once this package is installed (drivetrain is not on a package index yet)."""

CAPABILITIES = Capabilities(
    precisions=("fp32", "fp16", "bf16"),
    distributed=("zero",),
    devices=("cpu", "cuda"),
    notes={
        "distributed": "DeepSpeed ZeRO stages 1-3 (optimizer state, + gradients, + parameters sharded), started "
        "like driver='torch' distributed (torchrun, the deepspeed launcher, nproc=N, device=[0, 1], your own "
        "process group) or in one process; the config in deepspeed_kwargs['config'] (dict or JSON file), filled "
        "from the Trainer's precision, grad_clip, accumulation_steps and batch size. Needs deepspeed: "
        f"{INSTALL}.",
        "bf16": "DeepSpeed's bf16 (weights in bfloat16, fp32 master weights in the optimizer); float batches are "
        "cast to bfloat16.",
        "fp16": "DeepSpeed's fp16 with its dynamic loss scaler (GPUs; DeepSpeed's CPU accelerator has no fp16).",
        "serialization": "Checkpoints are the torch drivers' (safetensors + JSON, no pickle), sharded: each rank "
        "writes the ranges of the fp32 weights and optimizer state ZeRO gave it, nothing gathered; they load at "
        "any stage and world size, into driver='torch' and torch_fsdp, and theirs load here (state_dict='full' "
        "gathers one file on rank 0).",
    },
)

# contract_versions: what this release implements; never CONTRACT_VERSION (that follows the core).
# model_modules=(): a torch model is driver='torch''s for driver="auto"; ZeRO is chosen by name.
drivetrain_driver_specs = driver_specs_hook(
    "deepspeed", CAPABILITIES, contract_versions=(1,), seed_function="torch:manual_seed", model_modules=(),
    install=INSTALL,
)
"""The DeepSpeed driver's description (``seed_everything`` calls ``torch.manual_seed`` once torch is imported)."""
