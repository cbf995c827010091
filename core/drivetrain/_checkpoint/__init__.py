"""Checkpoints: the folder format (folder.py), nested-state encoding (codec.py), trainer state (training.py)."""

from .codec import StateEncodingError
from .folder import (
           CheckpointError,
           list_checkpoints,
           read_checkpoint,
           remove_checkpoint,
           resolve_resume_folder,
)

__all__ = ["CheckpointError", "StateEncodingError", "list_checkpoints", "read_checkpoint", "remove_checkpoint",
           "resolve_resume_folder"]
