"""Entry point of the torch backend: describes its driver without importing torch.

The ``drivetrain`` entry-point group points here; the core calls
:func:`drivetrain_driver_specs` during discovery, so this module must stay light
(it imports only the core). The driver itself is built by the lazy ``factory``.
"""

from __future__ import annotations

from drivetrain import Capabilities
from drivetrain.backend import driver_specs_hook


def _capabilities(mode: str, /, **notes: str) -> Capabilities:
    """A torch driver's: fp32, fp16 and bf16 on the CPU and CUDA GPUs, distributed in one ``mode``."""
    return Capabilities(precisions=("fp32", "fp16", "bf16"), distributed=(mode,), devices=("cpu", "cuda"),
                        notes=notes)


CAPABILITIES = _capabilities(
    "ddp",
    devices="cpu, cuda, cuda:N (aliases: gpu, gpu:N, an int N); None keeps the model where it is. "
    "MPS and XLA are not supported.",
    bf16="torch.autocast with bfloat16; works on CPU (often faster than fp32 there) and on CUDA GPUs "
    "that support bf16 (Ampere or newer).",
    fp16="torch.autocast with float16 plus torch.amp.GradScaler. On CPU it works but runs ~30x slower "
    "than fp32: use bf16 on CPU.",
    distributed="DistributedDataParallel on torch.distributed, one process per device (gloo on CPU, nccl "
    "on CUDA). Start with torchrun, or let the Trainer start the processes (device=[0, 1] or nproc=N in "
    "python train.py), or init_process_group yourself; collectives wait at most torch_kwargs['timeout'] "
    "(60 s) for a failed or stuck peer.",
    serialization="Tensors are saved with safetensors (no pickle); tied weights are stored as copies.",
)

FSDP_CAPABILITIES = _capabilities(
    "fsdp",
    distributed="torch FSDP2 (fully_shard): parameters, gradients and optimizer state sharded over the "
    "processes (gloo on CPU, nccl on CUDA), started like driver='torch' distributed (torchrun, nproc=N, "
    "device=[0, 1], or your own process group); options in torch_fsdp_kwargs (wrap, mixed_precision, "
    "cpu_offload, activation_checkpointing, reshard_after_forward, state_dict, init); a model built on the "
    "meta device is created shard by shard.",
    bf16="parameters gathered in bfloat16 for forward/backward (MixedPrecisionPolicy), gradients reduced "
    "in fp32, plus torch.autocast.",
    serialization="Sharded checkpoints: every rank writes its own pieces in parallel (safetensors + JSON, "
    "no pickle, nothing gathered); they load at any world size, into driver='torch' and every driver that reads "
    "the torch drivers' checkpoints, and "
    "`drivetrain export` merges them (torch_fsdp_kwargs['state_dict']='full': gathered to rank 0, one file).",
)

# contract_versions: what this release implements; never CONTRACT_VERSION (that follows the core)
drivetrain_driver_specs = driver_specs_hook(
    "torch", CAPABILITIES, contract_versions=(1,), seed_function="torch:manual_seed",
    variants={"torch_fsdp": {"factory": "drivetrain_torch.factory:create_fsdp_driver",
                             "capabilities": FSDP_CAPABILITIES,
                             "testing_kit": "drivetrain_torch.testing_kit:torch_fsdp_kit"}},
)
"""The torch driver's description (``seed_everything`` calls ``torch.manual_seed``, which seeds every CUDA device
too, once torch is imported)."""
