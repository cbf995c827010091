"""The single-process torch driver (:mod:`.factory` builds it, or the distributed one).

Every argument (device, model, precision, framework options) is validated up front, by
the factory and the constructor, so a wrong input fails when the Trainer is built, not
in the middle of the first epoch. The per-batch methods (``move_data_to_device``,
``auto_cast``, ``backward``, ``step``, ``zero_grad``) do as little as possible.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from drivetrain.backend import ModuleDriver, ShardSource

from . import _dataloader, _peft, _rng
from . import shards as _shards
from . import state as _state
from ._device import move_to_device, resolve_device
from .plugin import CAPABILITIES
from .precision import Precision

FRAMEWORK_KWARGS = {
    "grad_scaler_kwargs": "dict passed to torch.amp.GradScaler for precision='fp16' "
    "(init_scale, growth_factor, backoff_factor, growth_interval, enabled)",
    "non_blocking": "bool: copy batches to a GPU asynchronously (default True on CUDA; pin_memory=True "
    "in the DataLoader makes it effective)",
    "set_to_none": "bool: zero_grad sets gradients to None instead of filling zeros (default True)",
}
_DISTRIBUTED_ONLY_KWARGS = ("ddp_kwargs", "timeout", "backend", "even_batches", "spawn_output")

_LOW_PRECISION_FLOATS = (torch.float16, torch.bfloat16)


class TorchSingleDriver(ModuleDriver, torch_style="torch"):
    """Drives a ``torch.nn.Module`` in one process on one device (CPU or one CUDA GPU)."""

    name = "torch"
    capabilities = CAPABILITIES
    framework = torch
    optimizer_example = "torch.optim.AdamW(model.parameters(), lr=1e-3)"
    accepted_kwargs: Mapping[str, str] = FRAMEWORK_KWARGS
    """The ``torch_kwargs`` keys this driver understands, with what each means."""
    distributed_only_kwargs = _DISTRIBUTED_ONLY_KWARGS
    distributed_hint = "train distributed: device=[0, 1], nproc=N, or start the script with torchrun"
    state_ops = _state
    rng_ops = _rng
    data_ops = _dataloader
    reads_state_shards = True  # a sharded (FSDP) checkpoint loads here at any world size, DDP or one process

    def resolve_device(self, device: Any, model: Any) -> torch.device:
        return resolve_device(device, model)

    def configure(self, options: dict[str, Any]) -> None:
        self.non_blocking = self.flag_option(options, "non_blocking", self.device.type == "cuda")
        self.set_to_none = self.flag_option(options, "set_to_none", True)
        self._precision = Precision(self.precision, self.device, options.get("grad_scaler_kwargs"))
        self.grad_scaler = self._precision.scaler

    def companion_files(self, *, save_frozen: bool, merged: bool = False) -> dict[str, Any]:
        """A peft model's adapter files (what ``PeftModel.from_pretrained`` reads) when its base is left out; its
        base's Hugging Face ``config.json`` beside merged weights; nothing for any other model, or with
        ``save_frozen=True`` (the folder then holds the whole model)."""
        model = self.unwrap_model()
        if merged:
            return _peft.base_config_files(model)
        if save_frozen or not _peft.is_peft_model(model):
            return {}
        return _peft.adapter_files(model, self.tensor_file)

    def merged_adapter_state(self) -> dict[str, Any] | None:
        """A peft LoRA model's weights with the adapter folded in (see :func:`._peft.merged_state`); None for any
        other model."""
        model = self.unwrap_model()
        return _peft.merged_state(model) if _peft.is_peft_model(model) else None

    # ---------------------------------------------------------------------- model
    def unwrap_model(self) -> torch.nn.Module:
        """The user's module: the one the forward is called on (the model, or the module inside the user's DDP),
        looking through ``torch.compile`` wrappers."""
        model = self._wrapped_model_call()
        while isinstance(getattr(model, "_orig_mod", None), torch.nn.Module):
            model = model._orig_mod
        return model

    # --------------------------------------------------------------- optimisation
    def backward(self, loss: Any) -> None:
        """The template's checks and backward in one call: this runs every step."""
        if not isinstance(loss, torch.Tensor) or not loss.requires_grad:
            self.raise_bad_loss(loss)
        scaler = self.grad_scaler
        try:
            (loss if scaler is None else scaler.scale(loss)).backward()
        except RuntimeError as exc:
            if loss.numel() != 1:
                raise self.multi_value_error(loss) from exc
            raise
        # Keep the last loss (and so its graph, whose saved tensors backward has already freed)
        # until the next backward, as a hand-written loop's `loss` variable does: the graph holds
        # the parameters' AccumulateGrad nodes, which the next forward then reuses instead of
        # rebuilding them (~6k instructions per step for 2 parameters, GIL round trips included).
        self._last_loss = loss

    def zero_grad(self) -> None:
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=self.set_to_none)

    def set_group_lr(self, group: Any, lr: float) -> None:
        if isinstance(group["lr"], torch.Tensor):  # a tensor rate (capturable / fused optimizers): in place
            group["lr"].fill_(lr)
        else:
            group["lr"] = lr

    # ----------------------------------------------------------------------- data
    def move_data_to_device(self, batch: Any) -> Any:
        return move_to_device(batch, self.device, self.non_blocking)

    def tensor_to_numpy(self, tensor: Any) -> np.ndarray:
        if not isinstance(tensor, torch.Tensor):
            return np.asarray(tensor)
        copied = tensor.device.type != "cpu"
        if tensor.dtype in _LOW_PRECISION_FLOATS or (
            tensor.is_floating_point() and tensor.element_size() == 1
        ):
            tensor = tensor.detach().float()  # numpy has no bfloat16 / float8
            copied = True
        array = tensor.numpy(force=True)
        return array if copied else array.copy()

    # ---------------------------------------------------------------------- state
    def load_state_shards(self, source: ShardSource, *, optimizers: bool) -> None:
        """Each tensor filled from the stored chunks that overlap it (every rank reads the whole model here)."""
        _shards.load_state_shards(self.unwrap_model(), self.optimizers, source, optimizers)

    def seed(self, seed: int) -> None:
        torch.manual_seed(seed)  # seeds every CUDA device too (lazily if CUDA is not initialised yet)
        if torch.cuda.is_available():
            torch.cuda.manual_seed_all(seed)
