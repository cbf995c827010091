"""The checkpoint format on disk, with no framework: safetensors files written and read without pickle, the
manifest and its checksums, atomic folders, nested-state encoding and the layout of sharded saves."""

from . import safetensors_writer
from .codec import StateEncodingError, join_state, split_state
from .folder import (
           FROZEN_KEY,
           MANIFEST,
           CheckpointError,
           FileContent,
           LoadedCheckpoint,
           finish_checkpoint,
           is_sharded,
           list_checkpoints,
           newest_over_folders,
           read_checkpoint,
           read_manifest,
           remove_checkpoint,
           resolve_resume_folder,
           resumes_exactly,
           shard_files,
           temp_name,
           verified_file,
           write_checkpoint,
           write_files,
)
from .lock import FolderLock
from .safetensors_reader import read_entries
from .safetensors_writer import ITEM_SIZES, NUMPY_TAGS, TensorEntry, array_buffer
from .shard_checks import check_shard_model, check_shard_optimizers
from .shard_layout import (
           LAYOUT_FILE,
           MODEL_PREFIX,
           ShardPiece,
           ShardRead,
           ShardSource,
           StateShards,
           cannot_read_shards,
           flat_range_boxes,
           layout_chunks,
)

__all__ = [
    "FolderLock",     "CheckpointError", "FROZEN_KEY", "FileContent", "ITEM_SIZES", "LAYOUT_FILE", "LoadedCheckpoint",
    "MANIFEST", "MODEL_PREFIX", "NUMPY_TAGS", "ShardPiece", "ShardRead", "ShardSource", "StateEncodingError",
    "StateShards", "TensorEntry", "array_buffer", "cannot_read_shards", "check_shard_model",
    "check_shard_optimizers", "finish_checkpoint", "flat_range_boxes", "is_sharded", "join_state",
    "layout_chunks", "list_checkpoints", "newest_over_folders", "read_checkpoint", "read_entries",
    "read_manifest", "remove_checkpoint", "resolve_resume_folder", "resumes_exactly", "safetensors_writer",
    "shard_files", "split_state", "temp_name", "verified_file", "write_checkpoint", "write_files"
]
