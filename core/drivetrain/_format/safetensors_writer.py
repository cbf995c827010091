"""Writing safetensors files straight from tensor memory, hashing while writing.

Why: serialising a whole file into one ``bytes`` first costs a copy of every tensor
and a second pass to write it. Here each tensor's own buffer goes to the file, and
sha256 runs on a second thread over the same chunks as they are written (hashlib and
file writes release the GIL), so a file costs about one write of its data, or one
sha256 pass where hashing is the slower of the two.

The format is the public safetensors spec: 8 bytes little-endian header size ``N``,
``N`` bytes of JSON ``{name: {"dtype", "shape", "data_offsets": [begin, end]},
"__metadata__": {str: str}}`` padded with spaces to a multiple of 8, then the data
(offsets count from its start). Tensors are laid out the way safetensors lays them
out: larger dtypes first (so every tensor is aligned to its element size), then by
name; files come out byte-identical to ``safetensors.<framework>.save``.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from .._common import DriverError, start_writeback


class LazyBytes:
    """A tensor's bytes made only when the writer reaches it (``produce()``), and dropped once written: a file
    assembled tensor by tensor (``drivetrain export`` merging shards) holds one tensor in memory, not all."""

    def __init__(self, nbytes: int, produce: Callable[[], Any]) -> None:
        self.nbytes = int(nbytes)
        self.produce = produce


TensorEntry = tuple[str, str, tuple[int, ...], Any]
"""One tensor of a tensor file: (name, safetensors dtype tag, shape, its C-contiguous bytes on CPU: a buffer,
or :class:`LazyBytes`)."""

# safetensors' dtype order (smallest first); a file lists larger dtypes first, then names.
_DTYPE_ORDER = ("BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ",
                "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "C64", "F64", "I64", "U64")
ITEM_SIZES: dict[str, int] = {
    **dict.fromkeys(("BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ"), 1),
    **dict.fromkeys(("I16", "U16", "F16", "BF16"), 2),
    **dict.fromkeys(("I32", "U32", "F32"), 4),
    **dict.fromkeys(("C64", "F64", "I64", "U64"), 8),
}
"""Bytes per element of every dtype tag this writer accepts."""
_RANK = {tag: i for i, tag in enumerate(_DTYPE_ORDER)}

NUMPY_TAGS = {np.dtype(t): tag for t, tag in (
    (np.float64, "F64"), (np.float32, "F32"), (np.float16, "F16"), (np.int64, "I64"), (np.uint64, "U64"),
    (np.int32, "I32"), (np.uint32, "U32"), (np.int16, "I16"), (np.uint16, "U16"), (np.int8, "I8"),
    (np.uint8, "U8"), (np.bool_, "BOOL"), (np.complex64, "C64"))}

CHUNK = 8 << 20
"""Bytes per write/hash step: small enough that hashing trails writing by little, large enough to be cheap."""
_THREAD_MIN = 1 << 20
"""Below this many data bytes the hash runs inline: a thread would cost more than it saves."""


def array_buffer(array: np.ndarray, dtype: str | None = None) -> tuple[str, tuple[int, ...], memoryview]:
    """``(dtype tag, shape, bytes)`` of a numpy array, without a copy when it is C-contiguous little-endian.

    ``dtype`` overrides the tag, for frameworks whose dtype numpy lacks (bf16 handed over as
    int16/uint8 bytes). The view keeps ``array`` alive.
    """
    shape = tuple(int(n) for n in array.shape)
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    if dtype is None:
        dtype = NUMPY_TAGS.get(array.dtype.newbyteorder("="))
        if dtype is None:
            raise DriverError(f"has numpy dtype {array.dtype}, which safetensors cannot store.")
    if not array.flags.c_contiguous:
        array = array.copy(order="C")
    return dtype, shape, array.reshape(-1).view(np.uint8).data  # .data: the memoryview of the buffer


def _checked(entries: Iterable[TensorEntry]) -> list[tuple[str, str, tuple[int, ...], Any]]:
    """The entries with 1-D byte views (lazy ones kept lazy), each checked against its dtype and shape."""
    out: list[tuple[str, str, tuple[int, ...], Any]] = []
    seen: set[str] = set()
    for name, dtype, shape, buffer in entries:
        if not isinstance(name, str) or name == "__metadata__":
            raise DriverError(f"tensor name {name!r} is not allowed in a safetensors file (str, not '__metadata__').")
        if name in seen:
            raise DriverError(f"tensor name {name!r} appears twice in one tensor file.")
        seen.add(name)
        if dtype not in ITEM_SIZES:
            raise DriverError(f"tensor {name!r}: dtype {dtype!r} is not a safetensors dtype this writer knows "
                              f"({', '.join(_DTYPE_ORDER)}).")
        shape = tuple(int(n) for n in shape)
        expected = math.prod(shape) * ITEM_SIZES[dtype]
        if isinstance(buffer, LazyBytes):
            if buffer.nbytes != expected:
                raise DriverError(f"tensor {name!r}: {buffer.nbytes} bytes for dtype {dtype} and shape "
                                  f"{list(shape)}, which need {expected}.")
            out.append((name, dtype, shape, buffer))
            continue
        view = memoryview(buffer)
        if not view.c_contiguous:
            raise DriverError(f"tensor {name!r}: its buffer is not C-contiguous; tensor_buffer must return "
                              "contiguous bytes.")
        if view.format != "B" or view.ndim != 1:
            view = view.cast("B")
        if view.nbytes != expected:
            raise DriverError(f"tensor {name!r}: {view.nbytes} bytes for dtype {dtype} and shape {list(shape)}, "
                              f"which need {expected}.")
        out.append((name, dtype, shape, view))
    return out


def layout(entries: Iterable[TensorEntry], metadata: Mapping[str, str] | None = None) -> tuple[bytes, list[Any]]:
    """The file's first bytes (size + padded JSON header) and the tensor buffers in file order."""
    checked = sorted(_checked(entries), key=lambda e: (-_RANK[e[1]], e[0]))
    header: dict[str, Any] = {}
    if metadata:
        bad = [k for k, v in metadata.items() if not (isinstance(k, str) and isinstance(v, str))]
        if bad:
            raise DriverError(f"safetensors metadata must map str to str; not so for {bad[:5]}.")
        header["__metadata__"] = dict(metadata)
    offset = 0
    for name, dtype, shape, view in checked:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + view.nbytes]}
        offset += view.nbytes
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text, [view for *_, view in checked]


def encode(entries: Iterable[TensorEntry], metadata: Mapping[str, str] | None = None) -> bytes:
    """The whole file in memory (one copy of the data): for callers that need ``bytes``."""
    head, views = layout(entries, metadata)
    out = io.BytesIO()
    for chunk in _chunks([head, *views]):
        out.write(chunk)
    return out.getvalue()


def _nbytes(part: Any) -> int:
    return part.nbytes if isinstance(part, LazyBytes) else memoryview(part).nbytes


def _chunks(parts: Sequence[Any]) -> Iterable[memoryview]:
    """Every part's bytes in ``CHUNK``-sized views; a lazy part is made when reached and released after."""
    for part in parts:
        view = memoryview(part.produce() if isinstance(part, LazyBytes) else part).cast("B")
        if isinstance(part, LazyBytes) and view.nbytes != part.nbytes:
            raise DriverError(f"a lazily made tensor has {view.nbytes} bytes, {part.nbytes} were announced.")
        for start in range(0, view.nbytes, CHUNK):
            yield view[start:start + CHUNK]
        del view  # before the next part is made


def _write_all(fd: int, chunk: memoryview) -> None:
    while chunk.nbytes:
        written = os.write(fd, chunk)
        chunk = chunk[written:]


def write_parts(path: str, parts: Sequence[Any], *, durable: bool = True) -> tuple[str, int]:
    """Write ``parts`` one after another as the file ``path``; return (sha256 hex, size in bytes).

    Each chunk is hashed on a worker thread while the main thread writes it (one
    worker, so the updates stay in order). With ``durable`` the disk starts on each
    chunk as soon as it is written, and the file is fsynced before returning (while
    the hash may still be finishing).
    """
    size = sum(_nbytes(part) for part in parts)
    digest = hashlib.sha256()
    pool = ThreadPoolExecutor(1, thread_name_prefix="drivetrain-sha256") if size >= _THREAD_MIN else None
    pending: list[Future] = []
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_BINARY", 0), 0o666)
        try:
            offset = 0
            for chunk in _chunks(parts):
                if pool is None:
                    digest.update(chunk)
                else:
                    pending.append(pool.submit(digest.update, chunk))
                _write_all(fd, chunk)
                if durable:
                    start_writeback(fd, offset, chunk.nbytes)
                offset += chunk.nbytes
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
    finally:
        if pool is not None:
            pool.shutdown(wait=True)
    for future in pending:
        future.result()
    return digest.hexdigest(), size


def write_file(path: str, entries: Iterable[TensorEntry], metadata: Mapping[str, str] | None = None, *,
               durable: bool = True) -> tuple[str, int]:
    """Write a safetensors file from the tensors' own memory; return (sha256 hex, size in bytes)."""
    head, views = layout(entries, metadata)
    return write_parts(path, [head, *views], durable=durable)


def save(path: str, entries: Iterable[TensorEntry], metadata: Mapping[str, str] | None = None) -> int:
    """Write a safetensors file without hashing or fsync (``Driver.save_tensors``); return its size."""
    head, views = layout(entries, metadata)
    with open(path, "wb", buffering=0) as f:
        for chunk in _chunks([head, *views]):
            _write_all(f.fileno(), chunk)
    return len(head) + sum(_nbytes(view) for view in views)
