"""What a checkpoint holds and how the Trainer's state goes in and out of one: whole and sharded saves, frozen
bases, model export, LoRA merging and loading weights from any framework."""

from .background import HostBuffers, PendingSave
from .export import export_weights
from .load_weights import load_weights
from .trainer_io import (
    LoadedTrainer,
    TrainerState,
    load_trainer,
    load_weights_into,
    save_model,
    save_trainer,
    start_trainer_save,
)

__all__ = [
    "HostBuffers", "LoadedTrainer", "PendingSave", "TrainerState", "export_weights", "load_trainer", "load_weights",
    "load_weights_into", "save_model", "save_trainer", "start_trainer_save"
]
