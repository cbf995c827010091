"""Streaming data resumed from the loader's own position: torchdata's ``StatefulDataLoader`` and a Hugging Face
``datasets`` streaming dataset (local JSON lines, nothing downloaded) continue a mid-epoch checkpoint without
re-reading the epoch's first batches, bit-exactly; a plain stream re-reads them and the log says how many."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

from drivetrain import CheckpointCallback, Trainer, seed_everything

from .._signals import run_until_ctrl_c

N_RECORDS, BATCH, STOP_AT = 40, 4, 13  # 10 batches an epoch; the last checkpoint, at global batch 12, is
# batch 2 of epoch 1 (the second): the resumed run reads epoch 1 from its record 8 on


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(3, 1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> dict:
        return {"loss": torch.nn.functional.mse_loss(self.fc(x).squeeze(-1), y)}


def record(i: int) -> dict:
    return {"x": [float(i % 7), float(i % 5) - 2.0, float(i) / N_RECORDS], "y": float(i % 3)}


class CountingStream(IterableDataset):
    """A stream of records that counts what it hands out (what was read from the "source")."""

    def __init__(self) -> None:
        self.read = 0

    def __iter__(self):
        for i in range(N_RECORDS):
            self.read += 1
            item = record(i)
            yield {"x": torch.tensor(item["x"]), "y": torch.tensor(item["y"])}


class StatefulStream(CountingStream):
    """The same stream, able to say where it is (torchdata calls a dataset's state_dict/load_state_dict)."""

    def __init__(self) -> None:
        super().__init__()
        self.next_index, self.start = 0, 0

    def __iter__(self):
        start, self.start = self.start, 0
        for i in range(start, N_RECORDS):
            self.read += 1
            self.next_index = i + 1
            item = record(i)
            yield {"x": torch.tensor(item["x"]), "y": torch.tensor(item["y"])}

    def state_dict(self) -> dict:
        return {"next_index": self.next_index}

    def load_state_dict(self, state: dict) -> None:
        self.start = state["next_index"]


def trainer_for(loader, **kwargs) -> Trainer:
    model = Net()
    return Trainer(model, loader, torch.optim.SGD(model.parameters(), lr=0.05), driver="torch", device="cpu",
                   n_epochs=2, progress_bar=None, **kwargs)


def interrupted_then_resumed(make_loader, tmp_path) -> tuple[Trainer, Trainer, Trainer, object]:
    seed_everything(0)
    reference = trainer_for(make_loader())
    reference.run(num_eval_sanity_batch=0)
    seed_everything(0)
    first = trainer_for(make_loader(), callbacks=[CheckpointCallback(tmp_path / "ckpt", every_n_batches=3)])
    run_until_ctrl_c(first, STOP_AT, num_eval_sanity_batch=0)
    loader = make_loader()
    resumed = trainer_for(loader)
    resumed.run(resume_from=tmp_path / "ckpt", num_eval_sanity_batch=0)
    return reference, first, resumed, loader


def assert_same_weights(a: Trainer, b: Trainer) -> None:
    for name, value in a.model.state_dict().items():
        assert torch.equal(value, b.model.state_dict()[name]), name


def test_a_stateful_dataloader_resumes_from_its_position_without_re_reading(tmp_path, caplog) -> None:
    from torchdata.stateful_dataloader import StatefulDataLoader

    with caplog.at_level(logging.INFO, logger="drivetrain"):
        reference, _, resumed, loader = interrupted_then_resumed(
            lambda: StatefulDataLoader(StatefulStream(), batch_size=BATCH), tmp_path)
    assert_same_weights(reference, resumed)
    assert resumed.global_forward_batches == reference.global_forward_batches == 20
    assert loader.dataset.read == N_RECORDS - 2 * BATCH  # epoch 1 from its record 8: none read twice
    assert "from the StatefulDataLoader's saved position: no batch re-read" in caplog.text


def test_a_hugging_face_streaming_dataset_resumes_from_its_state(tmp_path, caplog) -> None:
    datasets = pytest.importorskip("datasets")
    data_file = tmp_path / "records.jsonl"
    data_file.write_text("".join(json.dumps(record(i)) + "\n" for i in range(N_RECORDS)))
    mapped: list[int] = []

    def make_loader():
        stream = datasets.load_dataset("json", data_files=str(data_file), split="train", streaming=True)
        stream = stream.map(lambda item: mapped.append(1) or item).with_format("torch")
        return DataLoader(stream, batch_size=BATCH)

    reference, _, _, _ = interrupted_then_resumed(make_loader, tmp_path / "a")
    mapped.clear()
    with caplog.at_level(logging.INFO, logger="drivetrain"):
        resumed_parts = interrupted_then_resumed(make_loader, tmp_path / "b")
    resumed = resumed_parts[2]
    assert_same_weights(reference, resumed)
    # this call's reference read 2 x 40 records and the interrupted run 13 x 4: the rest is the resumed run's,
    # epoch 1 from its record 8 on
    read_by_resumed = len(mapped) - (2 * N_RECORDS + STOP_AT * BATCH)
    assert read_by_resumed == N_RECORDS - 2 * BATCH, read_by_resumed
    assert "saved position: no batch re-read" in caplog.text


def test_a_stream_without_a_position_is_re_read_and_the_log_says_how_much(tmp_path, caplog) -> None:
    with caplog.at_level(logging.INFO, logger="drivetrain"), pytest.warns(RuntimeWarning, match="read and dropped"):
        reference, _, resumed, loader = interrupted_then_resumed(
            lambda: DataLoader(CountingStream(), batch_size=BATCH), tmp_path)
    assert_same_weights(reference, resumed)
    assert loader.dataset.read == N_RECORDS  # epoch 1's records, the first 8 read and dropped
    assert "re-reading 2 batch(es) of epoch 1" in caplog.text
