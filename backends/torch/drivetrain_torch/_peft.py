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
from collections.abc import Callable
from typing import Any

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
