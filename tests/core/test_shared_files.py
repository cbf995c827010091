"""Files a user shares with colleagues and other tools (numpy driver): they follow the umask, a plot lands beside
its run record, and a refusal to convert names the module kind its rule is for."""

from __future__ import annotations

import os
import stat

import numpy as np
import pytest

from drivetrain import CheckpointCallback, CheckpointError, TensorRule, WeightLayout, export_weights
from drivetrain._cli import main
from drivetrain._convert import engine

from ._callback_helpers import make_trainer

TO_WRITE = ("metrics.csv", "metrics.jsonl", "hparams.json", "summary.json", "manifest.json", "model.safetensors",
            "exported.safetensors", "curves.png")


def _write_everything(folder) -> None:
    """A run record (csv and jsonl), checkpoints, a saved model, an exported file and (with matplotlib) a plot."""
    trainer = make_trainer([CheckpointCallback(folder / "ckpt", every_n_batches=5)], n_epochs=1,
                           loggers=["csv", "jsonl"], log_every_n_steps=4, run_dir=folder / "run")
    trainer.run()
    trainer.save_model(folder / "model")
    export_weights(folder / "model", folder / "exported.safetensors")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return
    assert main(["plot", str(folder / "run"), "-o", str(folder / "curves.png")]) == 0


@pytest.mark.parametrize(("umask", "file_mode", "folder_mode"), [(0o022, 0o644, 0o755), (0o027, 0o640, 0o750)])
def test_every_file_drivetrain_writes_follows_the_umask(tmp_path, umask, file_mode, folder_mode):
    previous = os.umask(umask)
    try:
        _write_everything(tmp_path)
    finally:
        os.umask(previous)
    files, folders = {}, {}
    for root, dirs, names in os.walk(tmp_path):
        for name in names:
            files[os.path.relpath(os.path.join(root, name), tmp_path)] = stat.S_IMODE(os.stat(os.path.join(root, name)).st_mode)
        for name in dirs:
            folders[os.path.relpath(os.path.join(root, name), tmp_path)] = stat.S_IMODE(os.stat(os.path.join(root, name)).st_mode)
    written = {os.path.basename(path) for path in files}
    assert written >= set(TO_WRITE) - {"curves.png"}
    wrong = {path: oct(mode) for path, mode in files.items() if mode != file_mode}
    assert not wrong, f"files whose mode is not {oct(file_mode)} under umask {oct(umask)}: {wrong}"
    wrong = {path: oct(mode) for path, mode in folders.items() if mode != folder_mode}
    assert not wrong, f"folders whose mode is not {oct(folder_mode)} under umask {oct(umask)}: {wrong}"


def test_plot_writes_into_the_run_folder_and_prints_the_full_path(tmp_path, monkeypatch, capsys):
    pytest.importorskip("matplotlib")
    make_trainer(n_epochs=1, loggers=["jsonl"], log_every_n_steps=4, run_dir=tmp_path / "run").run()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    capsys.readouterr()
    assert main(["plot", "../run"]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {tmp_path / 'run' / 'curves.png'}"
    assert os.listdir(elsewhere) == []
    assert main(["plot", "../run", "-o", "mine.png"]) == 0  # -o: where the user says, printed in full
    assert capsys.readouterr().out.strip() == f"wrote {elsewhere / 'mine.png'}"


# ------------------------------------------------------ a layout rule that needs module classes nobody recorded
PADDLE_LIKE = WeightLayout(rules=(TensorRule("weight", transpose=True, modules=("Linear",)),))


def _tensor(shape):
    data = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    return engine.Tensor("F32", shape, memoryview(data.tobytes()), "x")


def test_a_refusal_for_unknown_module_classes_names_the_module_kind_the_rule_is_for():
    neutral = {"bn.weight": _tensor((3,)), "fc.weight": _tensor((2, 3))}
    with pytest.raises(CheckpointError) as caught:
        engine.from_neutral(neutral, PADDLE_LIKE, lambda path: None)
    message = str(caught.value)
    assert message.startswith("'bn.weight': the target framework stores the 'weight' of Linear modules transposed, "
                              "and whether 'bn' is such a module (Linear) is not known here")
    assert "of Linear modules differently" not in message
    # the route the message names: with the module classes known, only the Linear weight moves
    classes = {"bn": ("BatchNorm1D", "Layer"), "fc": ("Linear", "Layer")}
    moved = engine.from_neutral(neutral, PADDLE_LIKE, classes.get)
    assert moved["bn.weight"].shape == (3,) and moved["fc.weight"].shape == (3, 2)


def test_the_source_side_refusal_names_the_module_kind_too():
    with pytest.raises(CheckpointError, match=r"^'bn.weight': the source framework stores the 'weight' of Linear "
                                              r"modules transposed, and whether 'bn' is such a module \(Linear\)"):
        engine.to_neutral({"bn.weight": _tensor((3,))}, PADDLE_LIKE, lambda path: None, None)
