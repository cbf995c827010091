"""Entry point of the jittor backend: describes its drivers without importing jittor.

The ``drivetrain`` entry-point group points here; the core calls
:func:`drivetrain_driver_specs` during discovery, so this module must stay light
(it imports only the core). The driver itself is built by the lazy ``factory``, which
imports jittor through :func:`drivetrain_jittor.import_jittor` (environment defaults,
a status line while jittor compiles).
"""

from __future__ import annotations

from drivetrain import Capabilities, WeightLayout
from drivetrain.backend import driver_specs_hook

TESTED_JITTOR = "1.3.11.0"
"""The jittor release drivetrain-jittor pins; "not installed" messages name the core's install line for jittor
(from a checkout ``pip install -c constraints.txt -e . -e backends/jittor``)."""

CAPABILITIES = Capabilities(
    precisions=("fp32", "fp16"),
    distributed=("mpi",),
    devices=("cpu", "cuda"),
    notes={
        "devices": "cpu or cuda (aliases: gpu, cuda:0). jittor's device is global to the process "
        "(jt.flags.use_cuda) and it has no Module.to(): the driver sets the flag. One GPU per process: pick it "
        "with CUDA_VISIBLE_DEVICES (under mpirun each process takes the GPU of its local rank).",
        "fp16": "Global, and opt-in: jittor has no per-model autocast, only the process-wide "
        "jt.flags.auto_mixed_precision_level; while it is 4-6, matrix products and convolutions of float32 "
        "inputs produce float16 in any jittor code of the process. precision='fp16' needs "
        "jittor_kwargs={'amp_level': 4..6}; the driver sets that level around the training forward only and "
        "restores it after. No loss scaling, no fp32 master weights. On CPU float16 is emulated and slow: the "
        "driver warns.",
        "bf16": "Not offered: jittor's mixed-precision flag targets float16; it has bfloat16 Vars but no bfloat16 "
        "autocast.",
        "distributed": "MPI (OpenMPI): start with mpirun -np N python train.py; the driver detects it. Each "
        "process takes batch_size/N samples of every batch (jittor's convention); jittor's optimizer averages "
        "the gradients over the processes in backward. A process that fails makes mpirun stop the run "
        "(exit code != 0) instead of leaving the others waiting.",
        "serialization": "Tensors are saved with safetensors (no pickle; jt.save pickles and is never used); "
        "optimizer state is keyed by the model's parameter names.",
        "first import": "jittor compiles its C++ core on the first import on a machine (minutes; cached "
        "under ~/.cache/jittor); drivetrain-jittor prints a status line while it does.",
    },
)


# contract_versions: what this release implements; never CONTRACT_VERSION (that follows the core)
drivetrain_driver_specs = driver_specs_hook(
    "jittor", CAPABILITIES, contract_versions=(1,), seed_function="drivetrain_jittor._rng:seed_generator",
    weight_layout=WeightLayout(lacks=("num_batches_tracked",)),  # else the neutral (torch) layout
)
"""The jittor driver's description (``seed_everything`` calls its seed function once jittor is imported)."""
