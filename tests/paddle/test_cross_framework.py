"""Weights moving between paddle and the other frameworks through drivetrain: same logits within 1e-4 (fp32).

torch <-> paddle live in this env (it has torch too); jittor and oneflow through the folders they wrote
(``tests/data/cross_framework``, made by ``python -m tests._cross_generate <framework>``). Also the layouts of
embedding, layer-norm and attention layers, paddle.vision's ResNet-18 against the same ResNet-18 in torch,
``drivetrain convert`` and the refusals.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import drivetrain
from drivetrain import CheckpointError
from drivetrain._cli import main
from tests._cross_models import (
    DATA,
    TOLERANCE,
    committed_difference,
    live_difference,
    logits,
    max_difference,
    paddle_net,
    probe_input,
    randomize_statistics,
    torch_net,
    torch_resnet18,
    trainer_for,
)

paddle = pytest.importorskip("paddle")
torch = pytest.importorskip("torch")
pytest.importorskip("drivetrain_torch")


@pytest.mark.parametrize("source", ["torch", "jittor", "oneflow"])
def test_a_folder_written_in_another_framework_gives_the_same_logits(source):
    difference = committed_difference("paddle", source)
    print(f"{source} -> paddle (committed folder): max abs logit difference {difference:.3g}")
    assert difference <= TOLERANCE


@pytest.mark.parametrize("source, target", [("torch", "paddle"), ("paddle", "torch")])
def test_trained_in_one_loaded_in_the_other(tmp_path, source, target):
    difference = live_difference(source, target, str(tmp_path / "model"))
    print(f"{source} -> {target} (live): max abs logit difference {difference:.3g}")
    assert difference <= TOLERANCE


def test_an_exported_file_and_the_converted_folder_load_too(tmp_path):
    folder = os.path.join(DATA, "torch", "model")
    probe = np.load(os.path.join(DATA, "torch", "probe.npz"))
    exported = drivetrain.export_weights(folder, str(tmp_path / "torch.safetensors"))
    model = drivetrain.load_weights(paddle_net(), exported, driver="paddle")
    assert max_difference(logits("paddle", model, probe["x"]), probe["logits"]) <= TOLERANCE
    out = str(tmp_path / "as-paddle")
    assert main(["convert", folder, "--to", "paddle", "-o", out]) == 0
    converted = paddle_net()
    trainer_for("paddle", converted).load_model(out)  # a paddle folder now: paddle's own loading
    assert max_difference(logits("paddle", converted, probe["x"]), probe["logits"]) <= TOLERANCE
    back = str(tmp_path / "back-to-torch")
    assert main(["convert", out, "--to", "torch", "-o", back]) == 0
    restored = drivetrain.load_weights(torch_net(), back, driver="torch")
    assert max_difference(logits("torch", restored, probe["x"]), probe["logits"]) <= TOLERANCE
    assert "bn.num_batches_tracked" in restored.state_dict()


def _plain_torch_file(path: str) -> tuple:
    """A torch model's weights as Hugging Face writes them: ``safetensors.torch.save_file``, no drivetrain metadata."""
    from safetensors.torch import save_file

    torch.manual_seed(0)
    model = torch_net()
    randomize_statistics("torch", model, seed=2)
    save_file(model.state_dict(), path)
    x = probe_input()
    return x, logits("torch", model, x)


def test_a_plain_torch_safetensors_file_loads_when_its_driver_is_named(tmp_path):
    """A file that does not say which framework wrote it: read in paddle's own layout it does not fit, and the
    error names the fix; with ``source_driver='torch'`` it loads (load_weights, load_model, convert --from)."""
    path = str(tmp_path / "model.safetensors")
    x, expected = _plain_torch_file(path)
    with pytest.raises(CheckpointError, match=r"does not match this model.*source_driver='torch'"):
        drivetrain.load_weights(paddle_net(), path)
    model = drivetrain.load_weights(paddle_net(), path, source_driver="torch")
    assert max_difference(logits("paddle", model, x), expected) <= TOLERANCE
    through_trainer = paddle_net()
    trainer_for("paddle", through_trainer).load_model(path, source_driver="torch")
    assert max_difference(logits("paddle", through_trainer, x), expected) <= TOLERANCE
    out = str(tmp_path / "as-paddle")
    trainer_for("paddle", model).save_model(out)  # a paddle folder now, readable without naming anything
    assert max_difference(logits("paddle", drivetrain.load_weights(paddle_net(), out), x), expected) <= TOLERANCE


def test_converting_a_plain_file_without_a_model_needs_the_rules_to_need_no_module_classes(tmp_path, capsys):
    """``drivetrain convert --from torch`` reads the file in torch's layout, but paddle transposes the weights of
    Linear modules only, and a plain file records no module classes: refused, naming the route that works."""
    path = str(tmp_path / "model.safetensors")
    _plain_torch_file(path)
    assert main(["convert", path, "--to", "paddle", "-o", str(tmp_path / "out"), "--from", "torch"]) == 1
    err = capsys.readouterr().err
    assert "the target framework stores the 'weight' of Linear modules transposed" in err
    assert "is such a module (Linear or InstanceNorm1D" in err and "is not known here (the file records no" in err
    assert not os.path.exists(tmp_path / "out")


def test_source_driver_refusals(tmp_path, capsys):
    path = str(tmp_path / "model.safetensors")
    _plain_torch_file(path)
    assert main(["convert", path, "--to", "paddle", "-o", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert "does not say which framework's layout it is in" in err and "--from 'torch'" in err  # the CLI's option
    with pytest.raises(CheckpointError, match=r"source_driver='nosuch' names no installed driver"):
        drivetrain.load_weights(paddle_net(), path, source_driver="nosuch")
    with pytest.raises(drivetrain.ConfigurationError, match=r"source_driver=7 is not accepted"):
        drivetrain.load_weights(paddle_net(), path, source_driver=7)
    folder = os.path.join(DATA, "torch", "model")  # records that driver torch wrote it
    with pytest.raises(drivetrain.ConfigurationError, match=r"source_driver='jittor', but .* records that driver "
                                                            r"'torch' wrote it; drop source_driver"):
        drivetrain.load_weights(paddle_net(), folder, source_driver="jittor")
    model = drivetrain.load_weights(paddle_net(), folder, source_driver="torch")  # agreeing is fine
    probe = np.load(os.path.join(DATA, "torch", "probe.npz"))
    assert max_difference(logits("paddle", model, probe["x"]), probe["logits"]) <= TOLERANCE


def test_a_training_checkpoint_of_torch_does_not_resume_in_paddle(tmp_path):
    drivetrain.seed_everything(0)
    trainer_for("torch", torch_net()).save_checkpoint(str(tmp_path / "ckpt"))
    with pytest.raises(CheckpointError, match="resumes only in the framework that wrote it.*load_model"):
        trainer_for("paddle", paddle_net()).load_checkpoint(str(tmp_path / "ckpt"))


# ---------------------------------------------------------------- embedding, layer norm, attention
def _torch_block():
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb, self.norm = nn.Embedding(11, 8), nn.LayerNorm(8)
            self.query, self.key, self.value, self.out = (nn.Linear(8, 8) for _ in range(4))
            self.head = nn.Linear(8, 3)

        def forward(self, ids):
            h = self.norm(self.emb(ids))
            weights = torch.softmax(self.query(h) @ self.key(h).transpose(1, 2) / 8 ** 0.5, dim=-1)
            return self.head(self.out(weights @ self.value(h)).mean(dim=1))

    return Block()


def _paddle_block():
    from paddle import nn

    class Block(nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.emb, self.norm = nn.Embedding(11, 8), nn.LayerNorm(8)
            self.query, self.key, self.value, self.out = (nn.Linear(8, 8) for _ in range(4))
            self.head = nn.Linear(8, 3)

        def forward(self, ids):
            h = self.norm(self.emb(ids))
            weights = nn.functional.softmax(self.query(h) @ self.key(h).transpose([0, 2, 1]) / 8 ** 0.5, axis=-1)
            return self.head(self.out(weights @ self.value(h)).mean(axis=1))

    return Block()


def test_embedding_layer_norm_and_attention_projections_move(tmp_path):
    drivetrain.seed_everything(3)
    source = _torch_block()
    with torch.no_grad():
        for p in source.parameters():  # layer norm's weight and bias away from 1 and 0
            p.add_(torch.randn_like(p) * 0.3)
    ids = np.random.default_rng(0).integers(0, 11, (4, 6))
    folder = str(tmp_path / "block")
    trainer_for("torch", source).save_model(folder)
    target = drivetrain.load_weights(_paddle_block(), folder, driver="paddle")
    expected = source(torch.from_numpy(ids)).detach().numpy()
    got = target(paddle.to_tensor(ids)).numpy()
    assert max_difference(got, expected) <= TOLERANCE
    np.testing.assert_array_equal(target.emb.weight.numpy(), source.emb.weight.detach().numpy())  # not transposed
    np.testing.assert_array_equal(target.query.weight.numpy(), source.query.weight.detach().numpy().T)


def test_instance_norm_scale_moves_both_ways(tmp_path):
    source = torch.nn.InstanceNorm2d(3, affine=True)
    with torch.no_grad():
        source.weight.copy_(torch.tensor([0.5, 2.0, -1.0]))
        source.bias.copy_(torch.tensor([0.1, 0.2, 0.3]))
    trainer_for("torch", source).save_model(str(tmp_path / "in"))
    target = drivetrain.load_weights(paddle.nn.InstanceNorm2D(3), str(tmp_path / "in"), driver="paddle")
    np.testing.assert_array_equal(target.scale.numpy(), [0.5, 2.0, -1.0])
    x = np.random.default_rng(0).standard_normal((2, 3, 4, 4)).astype(np.float32)
    expected = source(torch.from_numpy(x)).detach().numpy()
    assert max_difference(target(paddle.to_tensor(x)).numpy(), expected) <= TOLERANCE
    trainer_for("paddle", target).save_model(str(tmp_path / "back"))
    back = drivetrain.load_weights(torch.nn.InstanceNorm2d(3, affine=True), str(tmp_path / "back"), driver="torch")
    np.testing.assert_array_equal(back.weight.detach().numpy(), [0.5, 2.0, -1.0])


def test_torch_packed_attention_is_refused_by_name_against_paddles_separate_projections(tmp_path):
    folder = str(tmp_path / "mha")
    trainer_for("torch", torch.nn.MultiheadAttention(8, 2)).save_model(folder)
    target = paddle.nn.MultiHeadAttention(8, 2)
    before = target.q_proj.weight.numpy().copy()
    with pytest.raises(CheckpointError) as caught:
        drivetrain.load_weights(target, folder, driver="paddle")
    text = str(caught.value)
    assert "in the file, not in the model: 'in_proj_weight'" in text
    assert "in the model, not in the file: 'q_proj.weight'" in text and "nothing was loaded" in text
    np.testing.assert_array_equal(target.q_proj.weight.numpy(), before)


# ---------------------------------------------------------------- a zoo model
@pytest.mark.parametrize("direction", ["torch->paddle", "paddle->torch"])
def test_paddle_vision_resnet18_and_the_same_resnet18_in_torch(tmp_path, direction):
    drivetrain.seed_everything(0)
    zoo, ours = paddle.vision.models.resnet18(), torch_resnet18()
    source, target = (("torch", ours), ("paddle", zoo)) if direction == "torch->paddle" else \
        (("paddle", zoo), ("torch", ours))
    randomize_statistics(source[0], source[1], seed=1)
    folder = str(tmp_path / "resnet18")
    trainer_for(*source).save_model(folder)
    trainer_for(*target).load_model(folder)
    x = np.random.default_rng(2).standard_normal((2, 3, 64, 64)).astype(np.float32)
    difference = max_difference(logits(target[0], target[1], x), logits(source[0], source[1], x))
    print(f"ResNet-18 {direction}: max abs logit difference {difference:.3g}")
    assert difference <= TOLERANCE
