"""Reading a safetensors file as views into its bytes, its header checked: no copy, no pickle."""

from __future__ import annotations

import json
import struct

from . import safetensors_writer
from .folder import CheckpointError

HEADER_LIMIT = 100 << 20
"""The largest header drivetrain reads (bytes): a damaged size field cannot make it read gigabytes of JSON."""


def read_entries(path: str, data: memoryview) -> tuple[list[safetensors_writer.TensorEntry], dict[str, str]]:
    """The tensors of a safetensors file as views into ``data``, and its metadata; the header is checked."""
    def damaged(why: str) -> CheckpointError:
        return CheckpointError(f"{path} is not a readable safetensors file: {why}.")

    if data.nbytes < 8:
        raise damaged("shorter than its 8-byte header size")
    (length,) = struct.unpack("<Q", data[:8])
    if length > min(HEADER_LIMIT, data.nbytes - 8):
        raise damaged(f"header size {length} exceeds the file")
    try:
        header = json.loads(bytes(data[8:8 + length]))
    except ValueError as exc:
        raise damaged(f"its header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise damaged("its header is not a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    body = data[8 + length:]
    entries: list[safetensors_writer.TensorEntry] = []
    for name, info in header.items():
        try:
            dtype, shape, (begin, end) = info["dtype"], tuple(info["shape"]), info["data_offsets"]
            expected = safetensors_writer.ITEM_SIZES[dtype]
            for n in shape:
                expected *= n
        except (KeyError, TypeError, ValueError):
            raise damaged(f"entry {name!r} has no valid dtype, shape and data_offsets") from None
        if not (0 <= begin <= end <= body.nbytes) or end - begin != expected:
            raise damaged(f"entry {name!r} has data offsets {[begin, end]} that do not fit its shape or the file")
        entries.append((name, dtype, shape, body[begin:end]))
    if not isinstance(metadata, dict):
        raise damaged("its __metadata__ is not an object")
    return entries, metadata
