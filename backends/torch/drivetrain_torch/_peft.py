"""A peft model's adapter in the files peft reads: ``save_model`` folders a ``PeftModel.from_pretrained`` loads.

drivetrain's own ``model.safetensors`` of a LoRA run already holds only the adapter (the base is
frozen, see the core's frozen-parameter handling), under the model's ``state_dict`` names
(``...lora_A.default.weight``). peft stores the same tensors under its own names (the adapter's
name dropped) in ``adapter_model.safetensors``, beside its config in ``adapter_config.json``; the
torch driver writes both into the folder too, so the folder is an adapter peft and Hugging Face
tools load as it is. peft is imported only for a model that is a peft model already.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import torch

from drivetrain.backend import DriverError

ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"


def is_peft_model(model: Any) -> bool:
    """A ``peft.PeftModel`` (by its class's module and its ``peft_config``; peft is not imported to ask)."""
    return type(model).__module__.split(".")[0] == "peft" and isinstance(getattr(model, "peft_config", None), dict)


def adapter_files(model: Any, tensor_file: Callable[[dict[str, Any]], Any]) -> dict[str, Any]:
    """``{adapter_model.safetensors: tensors, adapter_config.json: bytes}`` of the model's active adapter."""
    from peft.utils import get_peft_model_state_dict

    name = model.active_adapter if isinstance(model.active_adapter, str) else model.active_adapter[0]
    state = get_peft_model_state_dict(model, adapter_name=name)
    return {ADAPTER_WEIGHTS: tensor_file(state), ADAPTER_CONFIG: _config_json(model.peft_config[name])}


def _config_json(config: Any) -> bytes:
    """The config as peft writes it: its fields, sets as lists, ``inference_mode`` on (a saved adapter is
    loaded for inference unless the loader asks otherwise)."""
    fields = dict(config.to_dict())
    fields = {key: sorted(value) if isinstance(value, set) else value for key, value in fields.items()}
    fields["inference_mode"] = True
    return json.dumps(fields, indent=2, sort_keys=True, default=str).encode()


def merged_state(model: Any) -> dict[str, torch.Tensor]:
    """The base model's ``state_dict`` with each LoRA layer's weight replaced by ``weight + delta`` of its active
    adapters (peft's own ``get_delta_weight``, as ``merge_and_unload`` adds it), the LoRA tensors dropped and
    ``modules_to_save`` copies under the original names; the model itself is not changed."""
    from peft.tuners.lora import LoraLayer

    name = model.active_adapter if isinstance(model.active_adapter, str) else model.active_adapter[0]
    config = model.peft_config[name]
    if str(getattr(config.peft_type, "value", config.peft_type)) != "LORA" or getattr(config, "use_dora", False):
        raise DriverError(
            f"save_model(merge_adapters=True) merges LoRA adapters; this model's adapter {name!r} is "
            f"{getattr(config.peft_type, 'value', config.peft_type)}{' with DoRA' if getattr(config, 'use_dora', False) else ''}. "
            "Merge it with peft (model.merge_and_unload()) and save the result with save_model(folder, save_frozen=True).")
    base = model.get_base_model()
    saved_copy = re.compile(rf"\.modules_to_save\.{re.escape(name)}\.")
    state: dict[str, torch.Tensor] = {}
    for key, value in base.state_dict().items():
        if ".lora_" in key or ".original_module." in key or (".modules_to_save." in key and not saved_copy.search(key)):
            continue
        state[saved_copy.sub(".", key.replace(".base_layer.", "."))] = value
    with torch.no_grad():
        for module_name, layer in base.named_modules():
            if isinstance(layer, LoraLayer) and name in layer.lora_A:
                weight = layer.get_base_layer().weight
                state[f"{module_name}.weight"] = weight + layer.get_delta_weight(name).to(weight.dtype)
    return state


def base_config_files(model: Any) -> dict[str, bytes]:
    """The base model's ``config.json`` where it is a Hugging Face model, so ``from_pretrained`` reads the folder."""
    base = model.get_base_model() if is_peft_model(model) else model
    config = getattr(base, "config", None)
    return {"config.json": config.to_json_string().encode()} if hasattr(config, "to_json_string") else {}
