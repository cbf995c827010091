"""The core's streaming safetensors writer, checked against the safetensors library (numpy only)."""

from __future__ import annotations

import hashlib
import json
import os
import struct

import numpy as np
import pytest
import safetensors.numpy

from drivetrain import Driver, DriverError
from drivetrain._format import safetensors_writer as writer
from drivetrain._format.folder import read_checkpoint, write_checkpoint

NUMPY_DTYPES = (np.float64, np.float32, np.float16, np.int64, np.uint64, np.int32, np.uint32, np.int16, np.uint16,
                np.int8, np.uint8, np.bool_, np.complex64)


def random_array(dtype, shape, seed=0) -> np.ndarray:
    """Random bits (NaN payloads, subnormals, every bool byte 0/1) so bit-exactness is really tested."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape))
    rng = np.random.default_rng(seed)
    if dtype == np.bool_:
        return rng.integers(0, 2, n).astype(np.bool_).reshape(shape)
    return np.frombuffer(rng.bytes(n * dtype.itemsize), dtype=dtype).reshape(shape).copy()


def entries_of(tensors: dict[str, np.ndarray]) -> list:
    return [(name, *writer.array_buffer(array)) for name, array in tensors.items()]


def header_of(data: bytes) -> tuple[int, dict]:
    (size,) = struct.unpack("<Q", data[:8])
    return size, json.loads(data[8:8 + size])


def all_dtypes() -> dict[str, np.ndarray]:
    tensors = {}
    for i, dtype in enumerate(NUMPY_DTYPES):
        name = np.dtype(dtype).name
        tensors[f"{name}/matrix"] = random_array(dtype, (3, 5), seed=i)
        tensors[f"{name}/scalar"] = random_array(dtype, (), seed=100 + i)
        tensors[f"{name}/empty"] = random_array(dtype, (0, 4), seed=0)
    return tensors


def assert_bit_equal(got: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
    assert set(got) == set(expected)
    for name, array in expected.items():
        assert got[name].dtype == array.dtype and got[name].shape == array.shape, name
        assert got[name].tobytes() == array.tobytes(), name


# ------------------------------------------------------------------------ round trips
def test_every_numpy_dtype_round_trips_bit_exactly(tmp_path):
    tensors = all_dtypes()
    path = str(tmp_path / "all.safetensors")
    sha256, size = writer.write_file(path, entries_of(tensors))
    assert_bit_equal(safetensors.numpy.load_file(path), tensors)
    with open(path, "rb") as f:
        data = f.read()
    assert size == len(data) == os.path.getsize(path)
    assert sha256 == hashlib.sha256(data).hexdigest()


def test_file_is_byte_identical_to_safetensors_save():
    tensors = {"zeta": random_array(np.float32, (4, 3)), "alpha": random_array(np.int64, (2,)),
               "mid": random_array(np.uint8, (7,)), "flag": random_array(np.bool_, (3, 1)),
               "half": random_array(np.float16, (5,)), "0d": random_array(np.float64, ())}
    for metadata in (None, {"format": "pt", "note": "é ünïcode"}):
        ours = writer.encode(entries_of(tensors), metadata)
        theirs = safetensors.numpy.save(tensors, metadata=metadata)
        assert header_of(ours) == header_of(theirs)
        if metadata is None:  # safetensors orders metadata keys by a hash map: compare those by meaning only
            assert ours == theirs


def test_header_layout_matches_the_spec():
    tensors = {"b": random_array(np.uint8, (3,)), "a": random_array(np.float64, (2, 2)),
               "c": random_array(np.float32, (1,))}
    data = writer.encode(entries_of(tensors), {"k": "v"})
    size, header = header_of(data)
    assert size % 8 == 0 and data[8:8 + size].rstrip(b" ").endswith(b"}")  # padded with spaces
    assert list(header) == ["__metadata__", "a", "c", "b"]  # metadata first; larger dtypes first, then names
    assert header["__metadata__"] == {"k": "v"}
    assert header["a"] == {"dtype": "F64", "shape": [2, 2], "data_offsets": [0, 32]}
    assert header["c"]["data_offsets"] == [32, 36] and header["b"]["data_offsets"] == [36, 39]
    assert len(data) == 8 + size + 39
    assert data[8 + size:8 + size + 32] == tensors["a"].tobytes()


def test_empty_dict_writes_a_valid_empty_file(tmp_path):
    path = str(tmp_path / "empty.safetensors")
    sha256, size = writer.write_file(path, [])
    with open(path, "rb") as f:
        data = f.read()
    assert data == safetensors.numpy.save({}) and size == len(data)
    assert sha256 == hashlib.sha256(data).hexdigest()
    assert safetensors.numpy.load(data) == {}


def test_bf16_is_written_from_raw_bytes_with_its_tag():
    """numpy has no bf16: a framework hands its bits over as uint16 with the tag BF16."""
    bits = np.array([0x3F80, 0x7FC1, 0x0001, 0x8000], dtype=np.uint16)  # 1.0, a NaN payload, subnormal, -0.0
    data = writer.encode([("w", *writer.array_buffer(bits, dtype="BF16"))])
    size, header = header_of(data)
    assert header["w"] == {"dtype": "BF16", "shape": [4], "data_offsets": [0, 8]}
    assert data[8 + size:] == bits.tobytes()


def test_non_contiguous_and_big_endian_arrays_are_written_as_their_values():
    base = random_array(np.float32, (4, 6))
    tensors = {"t": base.T, "strided": base[:, ::2], "be": base.astype(">f4")}
    loaded = safetensors.numpy.load(writer.encode(entries_of(tensors)))
    np.testing.assert_array_equal(loaded["t"], base.T)
    np.testing.assert_array_equal(loaded["strided"], base[:, ::2])
    assert loaded["be"].dtype == np.float32 and loaded["be"].tobytes() == base.tobytes()


def test_many_chunks_hash_and_write_in_order(tmp_path, monkeypatch):
    """Small chunks and a forced hashing thread: the digest must still be that of the file."""
    monkeypatch.setattr(writer, "CHUNK", 4096)
    monkeypatch.setattr(writer, "_THREAD_MIN", 0)
    tensors = {f"t{i}": random_array(np.float32, (1000 + i,), seed=i) for i in range(20)}
    path = str(tmp_path / "chunks.safetensors")
    sha256, size = writer.write_file(path, entries_of(tensors))
    with open(path, "rb") as f:
        data = f.read()
    assert sha256 == hashlib.sha256(data).hexdigest() and size == len(data)
    assert_bit_equal(safetensors.numpy.load(data), tensors)


def test_save_writes_the_same_file_without_hashing(tmp_path):
    tensors = all_dtypes()
    path = str(tmp_path / "plain.safetensors")
    size = writer.save(path, entries_of(tensors))
    with open(path, "rb") as f:
        assert f.read() == writer.encode(entries_of(tensors)) and size == os.path.getsize(path)


# ----------------------------------------------------------------------------- errors
@pytest.mark.parametrize(("entry", "message"), [
    (("x", "F32", (3,), memoryview(bytes(8))), r"'x': 8 bytes for dtype F32 and shape \[3\], which need 12"),
    (("x", "F4", (2,), memoryview(bytes(1))), r"'x': dtype 'F4' is not a safetensors dtype this writer knows"),
    (("__metadata__", "U8", (1,), memoryview(bytes(1))), "'__metadata__' is not allowed"),
    ((1, "U8", (1,), memoryview(bytes(1))), "tensor name 1 is not allowed"),
    (("x", "U8", (2,), memoryview(np.zeros((2, 2), np.uint8)[:, 0])), "'x': its buffer is not C-contiguous"),
])
def test_bad_entries_are_refused_before_writing(entry, message):
    with pytest.raises(DriverError, match=message):
        writer.encode([entry])


def test_duplicate_names_and_bad_metadata_are_refused():
    one = ("x", "U8", (1,), memoryview(bytes(1)))
    with pytest.raises(DriverError, match="'x' appears twice"):
        writer.encode([one, one])
    with pytest.raises(DriverError, match="metadata must map str to str"):
        writer.encode([one], {"n": 1})
    with pytest.raises(DriverError, match="numpy dtype object"):
        writer.array_buffer(np.array([None]))


# ----------------------------------------------------------------- checkpoint folder
def test_write_checkpoint_records_tensor_files_like_bytes(tmp_path):
    tensors = all_dtypes()
    folder = write_checkpoint(str(tmp_path / "ckpt"), {"t.safetensors": entries_of(tensors), "b.json": b"{}"},
                              {"kind": "test"})
    loaded = read_checkpoint(folder)  # verifies size and sha256 of every file
    assert_bit_equal(safetensors.numpy.load(loaded.files["t.safetensors"]), tensors)
    record = loaded.manifest["files"]["t.safetensors"]
    assert record == {"sha256": hashlib.sha256(loaded.files["t.safetensors"]).hexdigest(),
                      "size": len(loaded.files["t.safetensors"])}
    assert loaded.manifest["files"]["b.json"]["size"] == 2


def test_write_checkpoint_failure_inside_a_tensor_file_leaves_nothing(tmp_path, monkeypatch):
    def fail(fd, chunk):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(writer, "_write_all", fail)
    with pytest.raises(OSError, match=r"t.safetensors.*No space left"):
        write_checkpoint(str(tmp_path / "ckpt"), {"t.safetensors": entries_of({"a": np.zeros(3)})}, {})
    assert os.listdir(tmp_path) == []


# ------------------------------------------------------------------ the Driver defaults
def test_numpy_driver_bytes_match_safetensors_and_round_trip(tmp_path):
    from drivetrain_numpy import LinearModel
    from drivetrain_numpy.driver import create_driver

    driver = create_driver(LinearModel(3, 2, seed=0), "cpu")
    tensors = all_dtypes()
    data = writer.encode(driver.tensor_file(tensors))
    assert data == safetensors.numpy.save(tensors)
    assert_bit_equal(driver.tensors_from_bytes(data), tensors)
    driver.save_tensors(tensors, tmp_path / "f.safetensors")
    assert (tmp_path / "f.safetensors").read_bytes() == data
    with pytest.raises(DriverError, match="save_tensors: 'lr' is a float, not a numpy array"):
        driver.tensor_file({"lr": 0.1})


def test_numpy_model_state_is_not_a_copy():
    from drivetrain_numpy import LinearModel
    from drivetrain_numpy.driver import create_driver

    model = LinearModel(3, 2, seed=0)
    state = create_driver(model, "cpu").model_state()
    assert all(state[k] is model.params[k] for k in model.params)


def test_a_backend_without_tensor_buffer_cannot_save_tensors(tmp_path):
    from drivetrain_numpy import LinearModel
    from drivetrain_numpy.driver import NumpyDriver

    class NoBuffer(NumpyDriver):
        tensor_buffer = Driver.tensor_buffer

    with pytest.raises(NotImplementedError, match="does not implement tensor_buffer"):
        NoBuffer(LinearModel(3, 2, seed=0)).save_tensors({"a": np.zeros(1)}, tmp_path / "a.safetensors")
    assert os.listdir(tmp_path) == []


def test_lazy_tensors_are_made_one_at_a_time_in_file_order(tmp_path):
    """``LazyBytes``: the same file as eager buffers; each tensor is made when the writer reaches it, and of those
    made before it at most the last is still held (``drivetrain export`` merges shards this way, so it holds one
    or two tensors, not the model)."""
    import gc
    import weakref

    tensors = {f"t{i}": random_array(np.float32, (64, 33), seed=i) for i in range(5)} | {
        "small": random_array(np.int8, (7,), seed=9)}
    made: list[str] = []
    alive: list[weakref.ref] = []

    def make(name: str):
        gc.collect()
        assert sum(ref() is not None for ref in alive) <= 1, f"{made} still held when {name} is made"
        array = tensors[name].copy()
        alive.append(weakref.ref(array))
        made.append(name)
        return writer.array_buffer(array)[2]

    lazy = [(name, *writer.array_buffer(array)[:2], writer.LazyBytes(array.nbytes, lambda name=name: make(name)))
            for name, array in tensors.items()]
    digest, size = writer.write_file(str(tmp_path / "lazy.safetensors"), lazy)
    eager = writer.encode(entries_of(tensors))
    assert (tmp_path / "lazy.safetensors").read_bytes() == eager
    assert (digest, size) == (hashlib.sha256(eager).hexdigest(), len(eager))
    assert made == ["t0", "t1", "t2", "t3", "t4", "small"]  # file order: larger dtypes first, then names
    assert writer.encode(lazy) == eager

    wrong = [("t", "F32", (2,), writer.LazyBytes(8, lambda: memoryview(b"\0" * 4)))]
    with pytest.raises(DriverError, match="4 bytes, 8 were announced"):
        writer.write_file(str(tmp_path / "wrong.safetensors"), wrong)
    with pytest.raises(DriverError, match=r"tensor 't': 12 bytes for dtype F32 and shape \[2\]"):
        writer.write_file(str(tmp_path / "wrong.safetensors"), [("t", "F32", (2,), writer.LazyBytes(12, bytes))])
