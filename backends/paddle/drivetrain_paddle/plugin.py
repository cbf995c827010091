"""Entry point of the paddle backend: describes its driver without importing paddle.

The ``drivetrain`` entry-point group points here; the core calls
:func:`drivetrain_driver_specs` during discovery, so this module must stay light
(it imports only the core). The driver itself is built by the lazy ``factory``.
"""

from __future__ import annotations

from drivetrain import Capabilities, TensorRule, WeightLayout
from drivetrain.backend import driver_specs_hook, ignore_framework_log_format

TESTED_PADDLE = "3.3.1"
"""The paddlepaddle release this backend is tested with; "not installed" messages name the core's install line
for paddle (from a checkout ``pip install -c constraints.txt -e . -e backends/paddle paddlepaddle==3.3.1``), GPU
users install paddlepaddle-gpu instead."""

PADDLE_ROOT_LOG_FORMAT = "[%(asctime)-15s] [%(levelname)8s] %(filename)s:%(lineno)s - %(message)s"
"""The format of the handler ``import paddle`` puts on the root logger (paddle.distributed.utils.log_utils's
get_logger(name="root")): drivetrain's own lines keep their format beside it."""
ignore_framework_log_format(PADDLE_ROOT_LOG_FORMAT)

CAPABILITIES = Capabilities(
    precisions=("fp32", "fp16", "bf16"),
    distributed=("ddp", "fleet"),
    devices=("cpu", "gpu"),
    notes={
        "devices": "cpu, gpu, gpu:N (aliases: cuda, cuda:N, an int N); None keeps the model where it is. "
        "GPUs need the paddlepaddle-gpu build. XPU and other custom devices are not supported.",
        "fp16": "paddle.amp.auto_cast (level O1, or O2 with paddle.amp.decorate) plus paddle.amp.GradScaler, "
        "on CUDA GPUs. Paddle has no float16 kernels on CPU: on CPU the driver warns once and trains in fp32.",
        "bf16": "paddle.amp.auto_cast with bfloat16 on GPUs that support it (Ampere or newer). Paddle has no "
        "bfloat16 kernels on CPU: on CPU the driver warns once and trains in fp32.",
        "static graph": "paddle_kwargs={'to_static': True, 'input_spec': [...]} trains through "
        "paddle.jit.to_static; drivetrain_paddle.export_inference_model saves a paddle inference model.",
        "distributed": "Data parallel on paddle.distributed, one process per device (gloo on CPU, nccl on GPUs): "
        "paddle.DataParallel, or fleet collective mode with paddle_kwargs={'fleet': True}. Start with python -m "
        "paddle.distributed.launch, or let the Trainer start the processes (device=[0, 1] or nproc=N in python "
        "train.py), or call init_parallel_env yourself. Gradients are averaged during backward with nccl, once per "
        "optimizer step with gloo (paddle_kwargs['overlap'] chooses). A failed or stuck peer ends the others within "
        "paddle_kwargs['timeout'] (30 s; on CPU gloo's own 30 s limit).",
        "serialization": "Tensors are saved with safetensors (no pickle); optimizer states are keyed by the "
        "model's structured parameter names, never by paddle's global names such as linear_0.w_0.",
    },
)


# How paddle's model files differ from the neutral (torch) layout: drivetrain moves weights between frameworks by it
WEIGHT_LAYOUT = WeightLayout(lacks=("num_batches_tracked",), rules=(  # Linear weights are [in, out]
    TensorRule("weight", transpose=True, modules=("Linear",)), TensorRule("_mean", neutral="running_mean"),
    TensorRule("_variance", neutral="running_var"),
    TensorRule("scale", neutral="weight", modules=("InstanceNorm1D", "InstanceNorm2D", "InstanceNorm3D"))))

# contract_versions: what this release implements; never CONTRACT_VERSION (that follows the core)
drivetrain_driver_specs = driver_specs_hook(
    "paddle", CAPABILITIES, contract_versions=(1,), seed_function="paddle:seed", weight_layout=WEIGHT_LAYOUT
)
"""The paddle driver's description (``seed_everything`` calls its seed function once paddle is imported)."""
