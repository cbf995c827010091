"""``drivetrain.export_weights`` / ``drivetrain export``: a checkpoint's weights as one safetensors file.

The exported file must load with a plain ``load_state_dict(load_file(path), strict=True)`` into a
freshly built model and equal the trained weights: from a one-process ``driver="torch"`` trainer
checkpoint, from ``save_model``, from two FSDP2 ranks (``driver="torch_fsdp"`` under torchrun, via
the FSDP test script), and through Hugging Face's ``from_pretrained``. Damaged input fails clearly.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch.utils.data import DataLoader, TensorDataset

import drivetrain
from drivetrain import CheckpointError, Trainer
from drivetrain._cli import main as cli

from .._dist_helpers import free_port
from .distributed import _fsdp_script as fsdp_script
from .distributed.conftest import ProcessGroup

pytestmark = [pytest.mark.torch, pytest.mark.timeout(180)]


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
        self.norm = torch.nn.BatchNorm1d(2)  # buffers (running stats, counter) must be exported too

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> dict:
        return {"loss": torch.nn.functional.cross_entropy(self.norm(self.body(x)), y)}


def _trained(tmp_path: Path) -> tuple[Net, Path, Path]:
    """A model trained a few steps; its trainer checkpoint and its save_model folder."""
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(32, 4), torch.randint(0, 2, (32,)))
    loader = DataLoader(data, batch_size=8, collate_fn=lambda items: {
        "x": torch.stack([i[0] for i in items]), "y": torch.stack([i[1] for i in items])})
    model = Net()
    trainer = Trainer(model, loader, torch.optim.Adam(model.parameters(), lr=0.05), driver="torch", n_epochs=1,
                      progress_bar=None)
    trainer.run()
    ckpt = Path(trainer.save_checkpoint(tmp_path / "ckpt"))
    saved = Path(trainer.save_model(tmp_path / "model")).parent
    return model, ckpt, saved


def _assert_loads_equal(path: str | Path, expected: dict[str, torch.Tensor], fresh: torch.nn.Module) -> None:
    fresh.load_state_dict(load_file(str(path)), strict=True)
    got = fresh.state_dict()
    assert sorted(got) == sorted(expected)
    for name, tensor in expected.items():
        assert torch.equal(got[name], tensor), name


@pytest.fixture
def trained(tmp_path) -> tuple[Net, Path, Path]:
    return _trained(tmp_path)


def test_trainer_checkpoint_and_save_model_export_to_a_plain_state_dict(trained, tmp_path) -> None:
    model, ckpt, saved = trained
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    out = drivetrain.export_weights(ckpt, tmp_path / "from-ckpt.safetensors")
    _assert_loads_equal(out, expected, Net())
    out_dir = tmp_path / "hf"
    out_dir.mkdir()
    out2 = drivetrain.export_weights(saved, out_dir)  # a folder: model.safetensors inside it
    assert out2 == str(out_dir / "model.safetensors")
    _assert_loads_equal(out2, expected, Net())
    # the parent of checkpoints: the newest is taken
    out3 = drivetrain.export_weights(tmp_path, tmp_path / "newest.safetensors")
    _assert_loads_equal(out3, expected, Net())
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]  # atomic: no temp file left behind


def test_cli_export(trained, tmp_path, capsys) -> None:
    model, ckpt, _ = trained
    target = tmp_path / "cli.safetensors"
    assert cli(["export", str(ckpt), "-o", str(target)]) == 0
    assert f"wrote {target}" in capsys.readouterr().out
    _assert_loads_equal(target, model.state_dict(), Net())
    assert cli(["export", str(tmp_path / "nope"), "-o", str(target)]) == 1
    err = capsys.readouterr().err
    assert "drivetrain export: CKPT (" in err and "no such file or folder" in err


def test_damaged_or_wrong_input_fails_clearly_and_writes_nothing(trained, tmp_path) -> None:
    _, ckpt, _ = trained
    target = tmp_path / "out.safetensors"
    with pytest.raises(FileNotFoundError, match=r"export_weights\(checkpoint=.*no such file or folder.*save_model"):
        drivetrain.export_weights(tmp_path / "missing", target)
    with pytest.raises(CheckpointError, match=r"export_weights\(checkpoint=.*is a file"):
        drivetrain.export_weights(ckpt / "model.safetensors", target)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CheckpointError, match="holds no manifest.json"):
        drivetrain.export_weights(empty, target)
    with pytest.raises(FileNotFoundError, match=r"export_weights\(out=.*does not exist"):
        drivetrain.export_weights(ckpt, tmp_path / "no-dir" / "x.safetensors")
    with pytest.raises(ValueError, match="checkpoint's own model file"):
        drivetrain.export_weights(ckpt, ckpt)
    model_file = ckpt / "model.safetensors"
    data = bytearray(model_file.read_bytes())
    data[-1] ^= 0xFF
    model_file.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="sha256 does not match"):
        drivetrain.export_weights(ckpt, target)
    model_file.write_bytes(bytes(data[:-4]))
    with pytest.raises(CheckpointError, match="truncated"):
        drivetrain.export_weights(ckpt, target)
    assert not target.exists()


def test_hugging_face_from_pretrained_reads_the_export(tmp_path) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(vocab_size=50, n_positions=16, n_embd=16, n_layer=1, n_head=2, use_cache=False)
    torch.manual_seed(1)
    model = transformers.GPT2LMHeadModel(config)  # ties lm_head.weight to transformer.wte.weight
    ids = torch.randint(0, 50, (8, 16))
    loader = DataLoader(TensorDataset(ids), batch_size=4,
                        collate_fn=lambda items: {"input_ids": torch.stack([i[0] for i in items]),
                                                  "labels": torch.stack([i[0] for i in items])})
    trainer = Trainer(model, loader, torch.optim.Adam(model.parameters(), lr=0.01), driver="torch", n_epochs=1,
                      progress_bar=None)
    trainer.run()
    saved = Path(trainer.save_model(tmp_path / "model")).parent
    folder = tmp_path / "hf"
    folder.mkdir()
    config.save_pretrained(folder)
    drivetrain.export_weights(saved, folder)
    loaded = transformers.GPT2LMHeadModel.from_pretrained(folder)
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name


@pytest.mark.distributed
def test_fsdp_checkpoints_from_two_ranks_export_to_the_full_model(tmp_path) -> None:
    """``driver="torch_fsdp"`` at 2 ranks: the interrupted trainer checkpoint and the final save_model."""
    script = str(Path(fsdp_script.__file__))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           script, str(tmp_path), "full,interrupt"]
    group = ProcessGroup(cmd, tmp_path)
    try:
        done = group.wait(150)
    finally:
        group.close()
    assert done.returncode == 0, done.output
    for phase, folder in (("interrupt", "interrupted"), ("full", "model")):
        result = json.loads((tmp_path / f"{phase}-rank0.json").read_text())
        assert result["driver"] == "TorchFSDPDriver" and result["world_size"] == 2
        out = drivetrain.export_weights(tmp_path / folder, tmp_path / f"{phase}.safetensors")
        fresh = fsdp_script.Net()
        fresh.load_state_dict(load_file(out), strict=True)
        got = fsdp_script.state_lists(fresh.state_dict())
        assert got == result["params"], phase


def test_bf16_weights_are_copied_bit_for_bit(tmp_path) -> None:
    """numpy has no bfloat16: the export copies bytes, so a bf16 model comes out exactly."""
    torch.manual_seed(2)
    model = Net().to(torch.bfloat16)
    loader = DataLoader(TensorDataset(torch.randn(4, 4)), batch_size=2)
    trainer = Trainer(model, loader, torch.optim.SGD(model.parameters(), lr=0.1), driver="torch", progress_bar=None)
    saved = Path(trainer.save_model(tmp_path / "model")).parent
    out = drivetrain.export_weights(saved, tmp_path / "bf16.safetensors")
    loaded = load_file(out)
    assert loaded["body.0.weight"].dtype == torch.bfloat16
    _assert_loads_equal(out, model.state_dict(), Net().to(torch.bfloat16))


def test_a_torch_compiled_model_exports_and_resumes_under_its_own_names(tmp_path) -> None:
    """``torch.compile`` wraps the model (its state_dict keys gain ``_orig_mod.``); checkpoints, exports and
    resumes use the user's module's names, so a plain model loads them and a compiled one resumes from them."""
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(32, 4), torch.randint(0, 2, (32,)))

    def trainer_for(model: torch.nn.Module, **kwargs) -> Trainer:
        loader = DataLoader(data, batch_size=8, collate_fn=lambda items: {
            "x": torch.stack([i[0] for i in items]), "y": torch.stack([i[1] for i in items])})
        return Trainer(model, loader, torch.optim.Adam(model.parameters(), lr=0.05), driver="torch", n_epochs=2,
                       progress_bar=None, **kwargs)

    torch.manual_seed(1)
    compiled = torch.compile(Net(), backend="eager")  # the eager backend: compiles nothing, wraps the same way
    assert all(k.startswith("_orig_mod.") for k in compiled.state_dict())
    trainer = trainer_for(compiled, n_batches=5)
    trainer.run()
    ckpt = trainer.save_checkpoint(tmp_path / "ckpt")
    expected = {k.removeprefix("_orig_mod."): v.clone() for k, v in compiled.state_dict().items()}
    _assert_loads_equal(drivetrain.export_weights(ckpt, tmp_path / "w.safetensors"), expected, Net())

    torch.manual_seed(1)
    again = torch.compile(Net(), backend="eager")
    resumed = trainer_for(again)
    resumed.run(resume_from=ckpt)
    torch.manual_seed(1)
    plain = Net()
    reference = trainer_for(plain)
    reference.run()
    for name, value in plain.state_dict().items():
        assert torch.equal(value, again.state_dict()["_orig_mod." + name]), name


def test_the_lora_merge_rounds_to_bf16_as_torch_does() -> None:
    """``export --base`` of a bf16 base computes in float32 and rounds back to bf16: bit for bit torch's rounding."""
    import numpy as np

    from drivetrain._checkpoint.merge_lora import _as_float32, _from_float32

    values = torch.randn(4096) * 10.0 ** torch.randint(-6, 6, (4096,))
    values[:4] = torch.tensor([0.0, -0.0, float("inf"), 1.0 + 2.0 ** -8])  # a tie: to even
    ours = _from_float32(values.numpy(), "BF16")
    assert np.array_equal(ours, values.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16))
    back = _as_float32("BF16", (4096,), ours.tobytes())
    assert torch.equal(torch.from_numpy(back), values.to(torch.bfloat16).float())
