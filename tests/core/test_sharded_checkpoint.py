"""Sharded checkpoints in the core: the read plans that reshard, and the write/verify/export protocol, on the
framework-free numpy driver taught to write shards (the torch FSDP tests run it with real ranks)."""

from __future__ import annotations

import itertools
import json
import os
from typing import Any

import numpy as np
import pytest
import safetensors

from drivetrain import CheckpointError, Trainer, export_weights
from drivetrain._checkpoint.frozen import combine, partial_sums
from drivetrain.backend import MODEL_PREFIX, ShardPiece, ShardSource, StateShards, flat_range_boxes
from drivetrain_numpy import SGD, ArrayLoader, LinearModel
from drivetrain_numpy.driver import NumpyDriver

from .conftest import make_regression


def _row_layout(shape: tuple[int, ...], world: int) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """A layout of one tensor ``t`` split by rows as FSDP splits (ceil-sized chunks), and its chunks."""
    full = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    rows = -(-shape[0] // world)
    chunks, stored = [], {}
    for rank in range(world):
        begin, end = min(rank * rows, shape[0]), min((rank + 1) * rows, shape[0])
        if begin == end:
            continue
        name = f"f{rank}"
        chunks.append({"file": name, "offsets": [begin, 0], "sizes": [end - begin, shape[1]]})
        stored[name] = full[begin:end]
    return {"t": {"dtype": "F32", "shape": list(shape), "chunks": chunks}}, stored


def _assemble(source: ShardSource, stored: dict[str, np.ndarray], offsets, sizes) -> np.ndarray:
    piece = np.full(sizes, -1.0, dtype=np.float32)
    for read in source.reads("t", offsets, sizes):
        chunk = stored[os.path.basename(read.path)]
        piece[read.target] = chunk if read.whole else chunk[read.source]
    return piece


@pytest.mark.parametrize(("saved", "loading"), list(itertools.product([1, 2, 3, 4], [1, 2, 3, 5])))
def test_reads_reshard_row_shards_to_any_world_size(saved, loading) -> None:
    shape = (10, 3)
    layout, stored = _row_layout(shape, saved)
    source = ShardSource("/ckpt", layout, None, saved)
    full = np.arange(30, dtype=np.float32).reshape(shape)
    rows = -(-shape[0] // loading)
    for rank in range(loading):
        begin, end = min(rank * rows, 10), min((rank + 1) * rows, 10)
        piece = _assemble(source, stored, (begin, 0), (end - begin, 3))
        assert np.array_equal(piece, full[begin:end])


def test_reads_fill_a_piece_cut_across_rows_and_columns() -> None:
    layout, stored = _row_layout((7, 6), 3)
    source = ShardSource("/ckpt", layout, None, 3)
    piece = _assemble(source, stored, (2, 1), (4, 3))
    assert np.array_equal(piece, np.arange(42, dtype=np.float32).reshape(7, 6)[2:6, 1:4])
    assert len(source.reads("t", (2, 1), (4, 3))) == 2  # rows 2 (file 0) and 3-5 (file 1)


def test_a_layout_with_a_missing_chunk_is_refused() -> None:
    layout, _ = _row_layout((6, 2), 3)
    del layout["t"]["chunks"][1]
    source = ShardSource("/ckpt", layout, None, 3)
    with pytest.raises(CheckpointError, match=r"cover 8 of the 12 values.*shards.json is damaged"):
        source.reads("t", (0, 0), (6, 2))
    with pytest.raises(CheckpointError, match="holds no 'u'"):
        source.reads("u", (0,), (1,))


# ------------------------------------------------------------- the protocol, on one process
class ShardingNumpyDriver(NumpyDriver):
    """The numpy driver writing its state as shards (one rank: each array is its own whole piece)."""

    shards_state = True
    reads_state_shards = True

    def state_shards(self, *, optimizers: bool) -> StateShards:
        pieces = {MODEL_PREFIX + k: ShardPiece(v, (0,) * v.ndim, v.shape) for k, v in self.model.params.items()}
        if optimizers:  # a stand-in for optimizer tensors: written with training checkpoints only
            pieces["optimizers/0/lr"] = ShardPiece(np.array([self.optimizers[0].lr], np.float32), (0,), (1,))
        return StateShards(pieces, {"lrs": [opt.lr for opt in self.optimizers]})

    def load_state_shards(self, source: ShardSource, *, optimizers: bool) -> None:
        params = {k: v for k, v in self.model.params.items() if k not in source.frozen}  # frozen: kept as they are
        if source.model_keys() != {k: v.shape for k, v in params.items()}:
            raise CheckpointError("the saved model does not match")
        for name, array in params.items():
            for read in source.reads(MODEL_PREFIX + name, (0,) * array.ndim, array.shape):
                with safetensors.safe_open(read.path, framework="np") as f:
                    array[read.target] = f.get_slice(read.key)[read.source]
        if optimizers:
            for opt, lr in zip(self.optimizers, source.meta["lrs"], strict=True):
                opt.lr = lr


def _trainer(driver_class=ShardingNumpyDriver, lr: float = 0.05) -> Trainer:
    model = LinearModel(3, 1)
    optimizer = SGD(model.params, model.grads, lr=lr)
    driver = driver_class(model)
    return Trainer(model, ArrayLoader(make_regression(), batch_size=8), optimizer, driver=driver, n_epochs=1,
                   progress_bar=None)


def test_a_sharded_checkpoint_round_trips_and_exports(tmp_path) -> None:
    trainer = _trainer()
    trainer.run()
    folder = tmp_path / "ckpt"
    trainer.save_checkpoint(folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["sharded"] == {"world_size": 1, "layout": "shards.json",
                                   "files": ["shards-00000-of-00001.safetensors"]}
    assert {"shards-00000-of-00001.safetensors", "shards.json", "training_state.json"} <= set(manifest["files"])
    assert "model.safetensors" not in manifest["files"]
    expected = {k: v.copy() for k, v in trainer.driver.model.params.items()}

    fresh = _trainer(lr=0.9)
    fresh.load_checkpoint(folder)
    assert all(np.array_equal(fresh.driver.model.params[k], v) for k, v in expected.items())
    assert fresh.driver.optimizers[0].lr == 0.05  # from the driver's meta

    exported = export_weights(folder, tmp_path / "weights.safetensors")
    with safetensors.safe_open(exported, framework="np") as f:
        assert {k: f.get_tensor(k).tolist() for k in f.keys()} == {k: v.tolist() for k, v in expected.items()}

    def stored_keys(path) -> set[str]:
        return set(json.loads((path / "shards.json").read_text())["tensors"])

    assert "optimizers/0/lr" in stored_keys(folder)
    trainer.save_model(tmp_path / "model")  # the weights only: the driver is asked for no optimizer state
    assert stored_keys(tmp_path / "model") == {MODEL_PREFIX + k for k in expected}


class FlatRangeNumpyDriver(ShardingNumpyDriver):
    """Writes every weight as the boxes of two flat ranges (as ZeRO-3 partitions a flattened tensor): the first
    range ends inside a row, so a key has several pieces, some of them partial rows."""

    def state_shards(self, *, optimizers: bool) -> StateShards:
        pieces: dict[str, Any] = {}
        for name, array in self.model.params.items():
            flat, cut = array.reshape(-1), array.size // 2 + 1
            pieces[MODEL_PREFIX + name] = [*_boxes(flat[:cut], 0, array.shape), *_boxes(flat[cut:], cut, array.shape)]
        return StateShards(pieces, {"lrs": [opt.lr for opt in self.optimizers]})


def _boxes(flat: np.ndarray, start: int, shape: tuple[int, ...]) -> list[ShardPiece]:
    pieces, at = [], 0
    for offsets, sizes in flat_range_boxes(start, flat.size, shape):
        n = int(np.prod(sizes))
        pieces.append(ShardPiece(flat[at:at + n].reshape(sizes), offsets, shape))
        at += n
    return pieces


@pytest.mark.parametrize("shape", [(7,), (5, 3), (4, 3, 5), (2, 1, 3, 2), ()])
def test_flat_range_boxes_cover_exactly_the_range_in_order(shape) -> None:
    total = int(np.prod(shape))
    full = np.arange(total).reshape(shape)
    for start in range(total + 1):
        for count in range(total - start + 1):
            boxes = flat_range_boxes(start, count, shape)
            got = [full[tuple(slice(o, o + s) for o, s in zip(offsets, sizes, strict=True))].reshape(-1)
                   for offsets, sizes in boxes]
            assert (np.concatenate(got) if got else np.arange(0)).tolist() == list(range(start, start + count))
            assert len(boxes) <= 2 * max(len(shape) - 1, 0) + 1  # partial rows at each level, one block of rows
    with pytest.raises(ValueError, match="do not fit a tensor of shape"):
        flat_range_boxes(3, total, shape)


def test_a_key_given_as_several_boxes_round_trips_and_exports(tmp_path) -> None:
    model = LinearModel(5, 3)  # a 5x3 weight: cut after 8 values, inside row 2
    for array in model.params.values():
        array[...] = np.arange(array.size, dtype=np.float32).reshape(array.shape) + 0.5
    trainer = Trainer(model, ArrayLoader(make_regression(), batch_size=8), SGD(model.params, model.grads, lr=0.05),
                      driver=FlatRangeNumpyDriver(model), n_epochs=1, progress_bar=None)
    trainer.save_checkpoint(tmp_path / "ckpt")
    layout = json.loads((tmp_path / "ckpt" / "shards.json").read_text())["tensors"]
    chunks = {key: [(c["offsets"], c["sizes"], c.get("key")) for c in entry["chunks"]] for key, entry in layout.items()}
    weight = [key for key in chunks if len(layout[key]["shape"]) == 2][0]
    assert chunks[weight] == [([0, 0], [2, 3], f"{weight}#0"), ([2, 0], [1, 2], f"{weight}#1"),
                              ([2, 2], [1, 1], f"{weight}#2"), ([3, 0], [2, 3], f"{weight}#3")]
    expected = {k: v.copy() for k, v in model.params.items()}

    fresh_model = LinearModel(5, 3, seed=7)
    fresh = Trainer(fresh_model, ArrayLoader(make_regression(), batch_size=8),
                    SGD(fresh_model.params, fresh_model.grads, lr=0.9), driver=ShardingNumpyDriver(fresh_model),
                    n_epochs=1, progress_bar=None)
    fresh.load_checkpoint(tmp_path / "ckpt", resume_training=False)
    assert all(np.array_equal(fresh_model.params[k], v) for k, v in expected.items())
    exported = export_weights(tmp_path / "ckpt", tmp_path / "weights.safetensors")
    with safetensors.safe_open(exported, framework="np") as f:
        assert {k: f.get_tensor(k).tolist() for k in f.keys()} == {k: v.tolist() for k, v in expected.items()}


def test_a_damaged_shard_file_loads_nothing(tmp_path) -> None:
    trainer = _trainer()
    trainer.run()
    trainer.save_checkpoint(tmp_path / "ckpt")
    shard = tmp_path / "ckpt" / "shards-00000-of-00001.safetensors"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 1
    shard.write_bytes(bytes(data))
    fresh = _trainer()
    before = {k: v.copy() for k, v in fresh.driver.model.params.items()}
    with pytest.raises(CheckpointError, match="shards-00000-of-00001.safetensors is damaged"):
        fresh.load_checkpoint(tmp_path / "ckpt")
    with pytest.raises(CheckpointError, match="is damaged"):
        export_weights(tmp_path / "ckpt", tmp_path / "w.safetensors")
    assert all(np.array_equal(fresh.driver.model.params[k], v) for k, v in before.items())


def test_a_failed_shard_write_keeps_the_previous_checkpoint(tmp_path, monkeypatch) -> None:
    trainer = _trainer()
    trainer.run()
    folder = tmp_path / "ckpt"
    trainer.save_checkpoint(folder)
    before = (folder / "manifest.json").read_bytes()

    def broken(tensors):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(trainer.driver, "tensor_file", broken)
    with pytest.raises(CheckpointError, match=r"rank 0 failed \(OSError.*No space left.*is unchanged"):
        trainer.save_checkpoint(folder)
    assert (folder / "manifest.json").read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]  # no temporary folder left behind


def test_a_driver_that_cannot_read_shards_says_how_to_get_the_weights(tmp_path) -> None:
    trainer = _trainer()
    trainer.run()
    trainer.save_checkpoint(tmp_path / "ckpt")
    plain = _trainer(NumpyDriver)
    with pytest.raises(CheckpointError, match=r"written in shards by 1 process.*drivetrain export"):
        plain.load_checkpoint(tmp_path / "ckpt")
    with pytest.raises(CheckpointError, match="drivetrain export"):
        plain.load_model(tmp_path / "ckpt")


def test_the_default_driver_does_not_shard() -> None:
    from drivetrain import DriverError

    driver = NumpyDriver(LinearModel(3, 1))
    assert driver.shards_state is False and driver.reads_state_shards is False
    with pytest.raises(DriverError, match="does not shard its state"):
        driver.state_shards(optimizers=True)


# ------------------------------------------------------------- frozen parameters in shards
class FrozenWeightDriver(FlatRangeNumpyDriver):
    """The flat-range shards of a model whose weight does not train (a frozen base under an adapter)."""

    def frozen_parameter_names(self) -> frozenset[str]:
        return frozenset({"weight"})


def _frozen_trainer(weight_seed: int = 0) -> Trainer:
    model = LinearModel(5, 3, seed=weight_seed)
    return Trainer(model, ArrayLoader(make_regression(), batch_size=8), SGD(model.params, model.grads, lr=0.05),
                   driver=FrozenWeightDriver(model), n_epochs=1, progress_bar=None)


def test_sharded_checkpoints_leave_frozen_parameters_out_and_check_them_on_load(tmp_path) -> None:
    trainer = _frozen_trainer()
    trainer.driver.model.params["bias"][...] = [0.25, -1.5, 3.0]  # "trained"
    trainer.save_checkpoint(tmp_path / "ckpt")
    manifest = json.loads((tmp_path / "ckpt" / "manifest.json").read_text())
    stored = set(json.loads((tmp_path / "ckpt" / "shards.json").read_text())["tensors"])
    assert stored == {MODEL_PREFIX + "bias"}
    assert {n: e[:2] for n, e in manifest["frozen"]["tensors"].items()} == {"weight": ["F32", [5, 3]]}
    assert manifest["frozen"]["bytes"] == 5 * 3 * 4

    same_base = _frozen_trainer()
    same_base.load_checkpoint(tmp_path / "ckpt")
    assert same_base.driver.model.params["bias"].tolist() == [0.25, -1.5, 3.0]
    with pytest.raises(CheckpointError, match="not the ones it was trained on: their values differ"):
        _frozen_trainer(weight_seed=1).load_checkpoint(tmp_path / "ckpt")
    with pytest.raises(CheckpointError, match="cannot be exported|frozen"):
        export_weights(tmp_path / "ckpt", tmp_path / "w.safetensors")

    trainer.save_model(tmp_path / "whole", save_frozen=True)
    assert set(json.loads((tmp_path / "whole" / "shards.json").read_text())["tensors"]) == {
        MODEL_PREFIX + "bias", MODEL_PREFIX + "weight"}


def _row_pieces(array: np.ndarray, world: int) -> list[list[tuple[Any, tuple, tuple]]]:
    rows = -(-array.shape[0] // world)
    return [[(array[r * rows:(r + 1) * rows], (r * rows,) + (0,) * (array.ndim - 1), array.shape)]
            for r in range(world) if r * rows < array.shape[0]]


def _flat_pieces(array: np.ndarray, world: int) -> list[list[tuple[Any, tuple, tuple]]]:
    flat, share = array.reshape(-1), -(-array.size // world)
    starts = [min(r * share, array.size) for r in range(world)]
    return [[(p.tensor, p.offsets, p.shape) for p in _boxes(flat[start:start + share], start, array.shape)]
            for start in starts]


@pytest.mark.parametrize("shape", [(7,), (5, 3), (4, 3, 5), ()])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64, np.bool_])
def test_the_frozen_checksum_is_the_same_however_the_tensor_is_sharded(shape, dtype) -> None:
    driver = FrozenWeightDriver(LinearModel(3, 1))
    values = np.asarray(np.random.default_rng(0).standard_normal(shape) * 100)
    array = np.asarray(values > 0) if dtype is np.bool_ else values.astype(dtype)
    whole = combine([partial_sums(driver, {"t": [(array, (), ())]})])
    for world in (1, 2, 3, 4):
        for split in (_row_pieces, _flat_pieces) if shape else (_flat_pieces,):
            ranks = [partial_sums(driver, {"t": pieces}) for pieces in split(array, world)]
            assert combine(ranks) == whole, (world, split.__name__)
    if array.size > 1:  # the position counts: swapping two different values changes it
        flat = array.reshape(-1).copy()
        i, j = next((i, j) for i in range(flat.size) for j in range(i + 1, flat.size) if flat[i] != flat[j])
        flat[[i, j]] = flat[[j, i]]
        assert combine([partial_sums(driver, {"t": [(flat.reshape(shape), (), ())]})]) != whole
