"""What a checkpoint holds and how the Trainer's state goes in and out of one: whole and sharded saves, frozen
bases, model export, LoRA merging and loading weights from any framework."""

from .export import export_weights
from .load_weights import load_weights
from .trainer_io import load_model, load_trainer, save_model, save_trainer
from .training import Position

__all__ = [
    "load_model", "load_trainer", "save_model", "save_trainer", "Position", "export_weights", "load_weights"
]
