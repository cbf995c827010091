"""Prediction: run a model over a dataloader and return every output as numpy, in dataset order.

The evaluation loop without metrics (same mapping, device moves, precision and
random-state care). Each batch's outputs are named (:func:`~drivetrain._mapping.outputs.named_outputs`,
nested values flattened to ``"a.b"`` keys), converted to numpy and kept per batch;
outputs whose first dimension is not the batch's (a scalar loss) are left out. At the
end the chunks are concatenated, padded with ``pad_value`` where batches differ in
trailing shape (sequences padded per batch). In a distributed run each rank reads
its contiguous shard of the dataset and the shards are gathered in rank order, which
is the dataset's order. With ``save_to=folder`` nothing is kept in memory: chunks
go to per-rank part files and are merged into one ``<output>.safetensors`` per output
plus ``predictions.json``; the result is then a dict of read-only memory maps.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from .._common import (
    ConfigurationError,
    check_int,
    parameter_names,
    resolve_precision,
    split_backend_kwargs,
    unknown_arguments_error,
)
from .._format import array_buffer
from .._mapping import LOSS, flatten_outputs, named_outputs
from .._progress import LoopDisplay, choose_loop_display
from ..backend import ArgumentNames, Driver, ModelStep, build_driver
from .inference import call_with_rng_kept, iterate_batches

METADATA_FILE = "predictions.json"
FORMAT = "drivetrain-predictions"
_NUMPY_OF_TAG = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1",
                 "U8": "u1", "U16": "<u2", "U32": "<u4", "U64": "<u8", "BOOL": "?"}


class Predictor:
    """One prediction pass of ``driver``'s model; :meth:`run` returns ``{name: array}``."""

    def __init__(self, driver: Driver, *, predict_fn: str | Callable | None = None, input_mapping: Any = None,
                 output_mapping: Any = None, progress_bar: Any = None, pad_value: float = -100,
                 names: ArgumentNames | None = None) -> None:
        if predict_fn is not None and not isinstance(predict_fn, str) and not callable(predict_fn):
            raise ConfigurationError(
                f"predict_fn={predict_fn!r} must be a method name of the model (str), a function(batch) or None."
            )
        if isinstance(pad_value, bool) or not isinstance(pad_value, (int, float)):
            raise ConfigurationError(f"pad_value={pad_value!r} must be a number (used where batches differ in shape).")
        self.driver = driver
        self.pad_value = pad_value
        self._display = choose_loop_display(progress_bar)
        self._step = ModelStep(driver, predict_fn, "predict_step", input_mapping, output_mapping,
                               names or ArgumentNames(),
                               "predict function")

    def run(self, dataloader: Any, *, num_batches: int = -1, save_to: str | os.PathLike | None = None,
            argument: str = "dataloader") -> dict[str, np.ndarray]:
        check_int(num_batches, "num_batches", minimum=1, allowed=(-1,))
        driver = self.driver
        driver.check_dataloader_legality(dataloader, argument=argument)
        loader = driver.set_dist_repro_dataloader(
            dataloader, dist="eval" if driver.is_distributed() else None, reproducible=False)
        sink: _Sink = _MemorySink() if save_to is None else _FileSink(os.fspath(save_to), driver.rank)
        driver.set_model_mode("eval")
        try:
            call_with_rng_kept(driver, lambda: self._collect(loader, num_batches, sink))
            return sink.finish(driver, self.pad_value)
        except BaseException:
            sink.abort()
            raise

    def _collect(self, loader: Any, limit: int, sink: _Sink) -> None:
        driver, step = self.driver, self._step
        display = self._display if driver.is_global_zero else LoopDisplay()
        skipped: set[str] = set()
        with driver.no_grad():
            for raw in iterate_batches(loader, limit, display, "predict"):
                batch = step.prepare(raw)
                outputs = flatten_outputs(named_outputs(step.call(batch), "predict function"),
                                          lambda v: driver.is_tensor(v) or isinstance(v, np.ndarray))
                arrays = {k: _to_numpy(driver, v) for k, v in outputs.items()}
                size = _batch_size(driver, batch, arrays)
                kept = {}
                for key, array in arrays.items():
                    if array.ndim >= 1 and array.shape[0] == size:
                        kept[key] = array
                    else:
                        skipped.add(key)
                sink.add(kept)
        skipped.discard(LOSS)
        if skipped and driver.is_global_zero:
            warnings.warn(
                f"predict: outputs {sorted(skipped)} do not have one row per sample of the batch and were left out; "
                "return per-sample values, or use output_mapping to drop or reshape them.",
                RuntimeWarning, stacklevel=4,
            )


def predict(model: Any, dataloader: Any, *, driver: str | Driver = "auto", device: Any = "cpu",
            predict_fn: str | Callable | None = None, input_mapping: Any = None, output_mapping: Any = None,
            model_wo_auto_param_call: bool = False, fp16: bool = False, precision: str | None = None,
            progress_bar: Any = "auto", num_batches: int = -1, save_to: str | os.PathLike | None = None,
            pad_value: float = -100, **kwargs: Any) -> dict[str, np.ndarray]:
    """Run ``model`` over ``dataloader`` without a Trainer; return ``{output name: numpy array}`` in dataset order.

    The function called is ``predict_fn`` (a method name or a function of the batch's
    values), else the model's ``predict_step`` if it has one, else its forward; the
    batch is matched to its parameters as in training. Outputs are named as the
    evaluation names them (a bare tensor is ``"pred"``, a ``ModelOutput``/dict by key).
    ``save_to`` streams the results into a folder (one ``.safetensors`` per output and
    ``predictions.json``) instead of memory. Example::

        logits = drivetrain.predict(model, test_loader, driver="torch")["logits"]

    Args:
        model: the model, an object of your framework.
        dataloader: the batches to predict.
        driver: ``"auto"``, a driver name, or a `Driver`.
        device: where the model runs, in the driver's terms.
        predict_fn: a model method name or a function of the batch's values (default: ``predict_step``,
            else forward).
        input_mapping: a dict renaming batch keys or a function of the batch.
        output_mapping: renames or reshapes the outputs.
        model_wo_auto_param_call: True passes the whole batch as one argument.
        fp16: shorthand for ``precision="fp16"``.
        precision: ``"fp32"``, ``"bf16"`` or ``"fp16"``.
        progress_bar: ``"auto"``, ``"rich"``, ``"tqdm"``, ``"raw"`` or None.
        num_batches: predict at most this many batches (-1: all).
        save_to: a folder to stream the outputs into, for predictions larger than memory.
        pad_value: fills the padding when batches of different lengths are stacked.
        **kwargs: ``<driver>_kwargs`` dicts of framework options.

    Returns:
        ``{output name: numpy array}``, one row per sample in dataset order (with ``save_to``: the same,
        memory-mapped from the folder).

    Raises:
        ConfigurationError: an argument is wrong (a misspelt keyword gets the closest accepted name).
        BatchMismatchError: a batch does not fit the predict function.
    """
    backend_kwargs, unknown = split_backend_kwargs(kwargs)
    if unknown:
        raise unknown_arguments_error("predict", unknown, parameter_names(predict),
                                      "Framework options go in '<driver>_kwargs' (e.g. torch_kwargs={...}).")
    if isinstance(driver, Driver):
        built = driver
    else:
        built = build_driver(driver, model, device, precision=resolve_precision(fp16, precision),
                             model_wo_auto_param_call=model_wo_auto_param_call, backend_kwargs=backend_kwargs)
        built.setup()
    predictor = Predictor(built, predict_fn=predict_fn, input_mapping=input_mapping, output_mapping=output_mapping,
                          progress_bar=progress_bar, pad_value=pad_value)
    return predictor.run(dataloader, num_batches=num_batches, save_to=save_to)


def load_predictions(folder: str | os.PathLike) -> dict[str, np.ndarray]:
    """Open a folder written by ``predict(..., save_to=folder)``: ``{name: read-only memory-mapped array}``.

    Nothing is read into memory until the arrays are indexed, so predictions larger than memory stay usable.

    Args:
        folder: the folder given to ``predict(save_to=...)``.

    Returns:
        ``{output name: read-only memory-mapped numpy array}``.

    Raises:
        ConfigurationError: ``folder`` holds no predictions written by :func:`predict`.
    """
    folder = os.fspath(folder)
    try:
        with open(os.path.join(folder, METADATA_FILE), encoding="utf-8") as f:
            meta = json.load(f)
    except FileNotFoundError:
        raise ConfigurationError(f"{folder} has no {METADATA_FILE}: it was not written by predict(save_to=...).") \
            from None
    if meta.get("format") != FORMAT:
        raise ConfigurationError(f"{folder}/{METADATA_FILE} is not a drivetrain predictions file.")
    out: dict[str, np.ndarray] = {}
    for name, entry in meta["outputs"].items():
        path = os.path.join(folder, entry["file"])
        with open(path, "rb") as f:
            (header_len,) = struct.unpack("<Q", f.read(8))
        out[name] = np.memmap(path, dtype=np.dtype(_NUMPY_OF_TAG[entry["dtype"]]), mode="r", offset=8 + header_len,
                              shape=tuple(entry["shape"]))
    return out


# ---------------------------------------------------------------------------- helpers
def _to_numpy(driver: Driver, value: Any) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value
    if driver.is_tensor(value):
        return driver.tensor_to_numpy(value)
    return np.asarray(value)


def _batch_size(driver: Driver, batch: Any, arrays: Mapping[str, np.ndarray]) -> int | None:
    """Samples in the batch: the first dimension of its first tensor, else of the first output."""
    def first_leaf(obj: Any) -> Any:
        if driver.is_tensor(obj) or isinstance(obj, np.ndarray):
            return obj
        values = obj.values() if isinstance(obj, Mapping) else obj if isinstance(obj, (list, tuple)) else ()
        for v in values:
            leaf = first_leaf(v)
            if leaf is not None:
                return leaf
        return None

    leaf = first_leaf(batch)
    shape = tuple(getattr(leaf, "shape", ())) if leaf is not None else ()
    if shape:
        return int(shape[0])
    for array in arrays.values():
        if array.ndim:
            return int(array.shape[0])
    return None


def _pad_to(array: np.ndarray, trailing: tuple[int, ...], pad_value: float) -> np.ndarray:
    if array.shape[1:] == trailing:
        return array
    out = np.full((array.shape[0], *trailing), pad_value, dtype=array.dtype)
    filled = (slice(None), *(slice(0, n) for n in array.shape[1:]))  # mypy takes out[(a, *b)] for 3.11 syntax
    out[filled] = array
    return out


def _common_layout(name: str, chunks: list[tuple[tuple[int, ...], str]]) -> tuple[int, tuple[int, ...], str]:
    """(rows, trailing shape padded to the largest, dtype) of an output's chunks; one dtype and rank required."""
    dtypes = {dtype for _, dtype in chunks}
    ranks = {len(shape) for shape, _ in chunks}
    if len(dtypes) > 1 or len(ranks) > 1:
        raise ConfigurationError(
            f"predict: output {name!r} changes dtype or number of dimensions between batches "
            f"({sorted(dtypes)}, {sorted(ranks)} dims); return the same kind of array for every batch."
        )
    trailing = tuple(max(dims) for dims in zip(*(shape[1:] for shape, _ in chunks), strict=True)) if chunks[0][0][1:] else ()
    return sum(shape[0] for shape, _ in chunks), trailing, dtypes.pop()


class _Sink:
    def add(self, arrays: dict[str, np.ndarray]) -> None:
        raise NotImplementedError

    def finish(self, driver: Driver, pad_value: float) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def abort(self) -> None:
        """Drop what was written (an exception ended the pass)."""


class _MemorySink(_Sink):
    def __init__(self) -> None:
        self.chunks: dict[str, list[np.ndarray]] = {}

    def add(self, arrays: dict[str, np.ndarray]) -> None:
        for key, array in arrays.items():
            self.chunks.setdefault(key, []).append(array)

    def finish(self, driver: Driver, pad_value: float) -> dict[str, np.ndarray]:
        parts = driver.all_gather_object(self.chunks) if driver.is_distributed() else [self.chunks]
        names = list(dict.fromkeys(k for part in parts for k in part))
        out = {}
        for name in names:
            chunks = [c for part in parts for c in part.get(name, [])]
            _, trailing, _ = _common_layout(name, [(c.shape, c.dtype.str) for c in chunks])
            out[name] = np.concatenate([_pad_to(c, trailing, pad_value) for c in chunks], axis=0)
        return out


class _FileSink(_Sink):
    """Chunks appended to ``<folder>/.parts/<output>.rank<r>``; rank 0 merges them in rank order."""

    def __init__(self, folder: str, rank: int) -> None:
        self.folder = folder
        self.rank = rank
        self.parts_dir = os.path.join(folder, ".parts")
        os.makedirs(self.parts_dir, exist_ok=True)
        self.chunks: dict[str, list[tuple[tuple[int, ...], str]]] = {}
        self.files: dict[str, str] = {}

    def _part(self, name: str, rank: int) -> str:
        return os.path.join(self.parts_dir, f"{_file_stem(name)}.rank{rank}")

    def add(self, arrays: dict[str, np.ndarray]) -> None:
        for key, array in arrays.items():
            tag, shape, view = array_buffer(array)
            path = self.files.setdefault(key, self._part(key, self.rank))
            with open(path, "ab") as f:
                f.write(view)
            self.chunks.setdefault(key, []).append((shape, tag))

    def finish(self, driver: Driver, pad_value: float) -> dict[str, np.ndarray]:
        parts = driver.all_gather_object(self.chunks) if driver.is_distributed() else [self.chunks]
        if driver.is_global_zero:
            self._merge(parts, pad_value)
        driver.barrier()
        return load_predictions(self.folder)

    def _merge(self, parts: list[dict[str, list[tuple[tuple[int, ...], str]]]], pad_value: float) -> None:
        names = list(dict.fromkeys(k for part in parts for k in part))
        meta: dict[str, Any] = {"format": FORMAT, "version": 1, "outputs": {}}
        for name in names:
            chunks = [(tuple(shape), tag) for part in parts for shape, tag in part.get(name, [])]
            rows, trailing, tag = _common_layout(name, chunks)
            dtype = np.dtype(_NUMPY_OF_TAG[tag])
            file = f"{_file_stem(name)}.safetensors"
            target = os.path.join(self.folder, file)
            nbytes = rows * int(np.prod(trailing, dtype=np.int64)) * dtype.itemsize
            header = json.dumps({name: {"dtype": tag, "shape": [rows, *trailing], "data_offsets": [0, nbytes]}},
                                separators=(",", ":")).encode()
            header += b" " * (-len(header) % 8)
            tmp = target + ".tmp"
            with open(tmp, "wb") as out:
                out.write(struct.pack("<Q", len(header)) + header)
                for rank, part in enumerate(parts):
                    offset = 0
                    with open(self._part(name, rank), "rb") as src:
                        for shape, _ in part.get(name, []):
                            count = int(np.prod(shape, dtype=np.int64))
                            src.seek(offset)
                            chunk = np.fromfile(src, dtype=dtype, count=count).reshape(shape)
                            offset += count * dtype.itemsize
                            out.write(_pad_to(chunk, trailing, pad_value).tobytes())
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, target)
            padded = any(tuple(shape[1:]) != trailing for shape, _ in chunks)
            meta["outputs"][name] = {"file": file, "dtype": tag, "shape": [rows, *trailing],
                                     "pad_value": pad_value if padded else None}
        meta["count"] = max((entry["shape"][0] for entry in meta["outputs"].values()), default=0)
        tmp_meta = os.path.join(self.folder, METADATA_FILE + ".tmp")
        with open(tmp_meta, "w", encoding="utf-8") as f:
            json.dump(meta, f, indent=1)
        os.replace(tmp_meta, os.path.join(self.folder, METADATA_FILE))
        shutil.rmtree(self.parts_dir, ignore_errors=True)

    def abort(self) -> None:
        shutil.rmtree(self.parts_dir, ignore_errors=True)


def _file_stem(name: str) -> str:
    """An output name as a file name (``hidden_states.0`` stays readable; path separators do not survive)."""
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in name) or "output"
