"""Entry point of the oneflow backend: describes its driver without importing oneflow.

The ``drivetrain`` entry-point group points here; the core calls
:func:`drivetrain_driver_specs` during discovery, so this module must stay light
(it imports only the core). The driver itself is built by the lazy ``factory``,
which first checks the Python and oneflow versions (:mod:`._compat`).
"""

from __future__ import annotations

from drivetrain import Capabilities
from drivetrain.backend import driver_specs_hook

from ._compat import INSTALL

INSTALL_HINT = f"{INSTALL} (in a Python 3.10 environment: oneflow has no working wheels for newer Pythons)"

CAPABILITIES = Capabilities(
    precisions=("fp32", "fp16", "bf16"),
    distributed=("ddp",),
    devices=("cpu", "cuda"),
    notes={
        "python": "oneflow 0.9.0 has wheels for Python <= 3.10 only: this backend runs on Python 3.10.",
        "devices": "cpu, cuda, cuda:N (aliases: gpu, gpu:N, an int N); None keeps the model where it is. "
        "CUDA availability is checked before anything moves (oneflow aborts the process on a bad .to('cuda')).",
        "fp16": "oneflow.autocast('cuda', float16) plus a dynamic loss scaler in drivetrain (oneflow 0.9's "
        "GradScaler serves nn.Graph only). CUDA only: oneflow has no CPU autocast, so on CPU the driver warns "
        "and trains in fp32.",
        "bf16": "oneflow.autocast('cuda', bfloat16) on GPUs that support it; on CPU the driver warns and trains "
        "in fp32.",
        "distributed": "oneflow.nn.parallel.DistributedDataParallel, one process per device. Start with python -m "
        "oneflow.distributed.launch --nproc_per_node N train.py, or let the Trainer start the processes "
        "(nproc=N or device=[0, 1] in python train.py: that process supervises N workers). Object collectives "
        "are built on oneflow tensor collectives. no_sync: oneflow's DDP cannot skip its gradient all-reduce, "
        "so accumulation steps all-reduce every micro-batch (same result, more communication).",
        "random": "oneflow 0.9 gives each Dropout its own generator (not reached by oneflow.manual_seed) and its "
        "get_rng_state loses the generator's position; checkpoints capture every generator at its exact position "
        "(without changing any draw), and Driver.seed reseeds the Dropouts' too.",
        "serialization": "Tensors are saved with safetensors (no pickle, never oneflow.save); bf16 round-trips "
        "bit-exactly.",
    },
)


# contract_versions: what this release implements; never CONTRACT_VERSION (that follows the core)
drivetrain_driver_specs = driver_specs_hook(
    "oneflow", CAPABILITIES, contract_versions=(1,), install=INSTALL_HINT, seed_function="oneflow:manual_seed"
)
"""The oneflow driver's description (``seed_everything`` calls its seed function once oneflow is imported)."""
