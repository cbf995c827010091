"""Moving weights between frameworks, on the framework-free numpy driver: the layout rule engine, load_model /
load_weights / convert_weights / ``drivetrain convert`` across two drivers whose files differ, and the refusals.

``numpy_t`` is a numpy driver that stores its model as another framework would: the weight transposed (declared
for modules of class ``LinearModel``) and the bias under the name ``offset``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest
import safetensors.numpy

import drivetrain
from drivetrain import (
    CheckpointError,
    ConfigurationError,
    DriverSpec,
    TensorRule,
    Trainer,
    WeightLayout,
    hookimpl,
)
from drivetrain._cli import main
from drivetrain.backend._plugins import reset_registry
from drivetrain_numpy.driver import NumpyDriver

from .conftest import drivetrain_numpy, make_regression

T_LAYOUT = WeightLayout(rules=(TensorRule("weight", transpose=True, modules=("linearmodel",)),
                               TensorRule("offset", neutral="bias")))
HWIO_LIKE = WeightLayout(rules=(TensorRule("kernel", neutral="weight", permute=(2, 3, 1, 0), modules=("Conv",)),))
"""flax's convolution kernels: [h, w, in, out] where the neutral (torch) layout has [out, in, h, w]."""
PADDLE_LIKE = WeightLayout(rules=(TensorRule("weight", transpose=True, modules=("Linear",)),
                                  TensorRule("_mean", neutral="running_mean"),
                                  TensorRule("_variance", neutral="running_var")), lacks=("num_batches_tracked",))


class TransposedNumpyDriver(NumpyDriver):
    """The numpy driver with another framework's file layout: ``weight`` as [out, in], ``bias`` named ``offset``."""

    name = "numpy_t"

    def model_state(self) -> dict[str, Any]:
        return {"weight": self.model.params["weight"].T, "offset": self.model.params["bias"]}

    def load_model_state(self, state: Mapping[str, Any]) -> None:
        super().load_model_state({"weight": np.asarray(state["weight"]).T, "bias": state["offset"]})

    def module_classes(self) -> dict[str, tuple[str, ...]]:
        return {"": ("LinearModel",)}


def create_transposed(model: Any, device: Any, **options: Any) -> TransposedNumpyDriver:
    options.pop("framework_kwargs", None)
    options.pop("nproc", None)
    return TransposedNumpyDriver(model, **options)


class _Plugin:
    @hookimpl
    def drivetrain_driver_specs(self):
        return [DriverSpec(name="numpy_t", framework="numpy", factory=f"{__name__}:create_transposed",
                           contract_versions=(1,), weight_layout=T_LAYOUT),
                DriverSpec(name="bn_counting", framework="numpy", factory=f"{__name__}:create_transposed",
                           contract_versions=(1,)),
                DriverSpec(name="bn_plain", framework="numpy", factory=f"{__name__}:create_transposed",
                           contract_versions=(1,), weight_layout=WeightLayout(lacks=("num_batches_tracked",))),
                DriverSpec(name="hwio_like", framework="numpy", factory=f"{__name__}:create_transposed",
                           contract_versions=(1,), weight_layout=HWIO_LIKE)]


@pytest.fixture(autouse=True)
def numpy_t():
    drivetrain.register_plugin(_Plugin(), name="numpy-t-plugin")
    yield
    reset_registry()


def trained(in_features: int = 3, out_features: int = 2, seed: int = 0) -> Any:
    """A numpy model trained a little, so its weights are its own (not the seed's)."""
    model = drivetrain_numpy.LinearModel(in_features, out_features, seed=seed)
    model.params["bias"][...] = np.arange(out_features, dtype=np.float32) + 0.25
    data = make_regression(in_features=in_features)
    data["target"] = np.repeat(data["target"], out_features, axis=1)
    opt = drivetrain_numpy.SGD(model.params, model.grads, lr=0.05)
    Trainer(model, drivetrain_numpy.ArrayLoader(data, batch_size=8), optimizers=opt, driver="numpy",
            progress_bar=None).run()
    return model


def predictions(model: Any) -> np.ndarray:
    x = np.random.default_rng(5).standard_normal((6, model.params["weight"].shape[0])).astype(np.float32)
    return x @ model.params["weight"] + model.params["bias"]


def fresh_trainer(driver: str, model: Any = None) -> Trainer:
    model = model if model is not None else drivetrain_numpy.LinearModel(3, 2, seed=9)
    return Trainer(model, drivetrain_numpy.ArrayLoader(make_regression(), batch_size=8), driver=driver,
                   optimizers=drivetrain_numpy.SGD(model.params, model.grads, lr=0.05), progress_bar=None)


def saved(tmp_path, driver: str = "numpy", model: Any = None) -> tuple[Any, str]:
    model = model if model is not None else trained()
    folder = str(tmp_path / f"saved-{driver}")
    fresh_trainer(driver, model).save_model(folder)
    return model, folder


# ------------------------------------------------------------------ loading across drivers
def test_a_model_folder_moves_both_ways_with_the_same_predictions(tmp_path):
    source, folder = saved(tmp_path)
    target = fresh_trainer("numpy_t")
    target.load_model(folder)
    np.testing.assert_array_equal(predictions(target.driver.model), predictions(source))
    back_folder = str(tmp_path / "back")
    target.save_model(back_folder)
    with open(os.path.join(back_folder, "manifest.json")) as f:
        manifest = json.load(f)
    assert manifest["driver"] == "numpy_t" and manifest["module_classes"] == {"": ["LinearModel"]}
    assert manifest["weight_layout"] == T_LAYOUT.to_json()
    back = drivetrain.load_weights(drivetrain_numpy.LinearModel(3, 2, seed=3), back_folder, driver="numpy")
    np.testing.assert_array_equal(predictions(back), predictions(source))


def test_an_exported_file_of_another_driver_loads_too(tmp_path):
    source, folder = saved(tmp_path, "numpy_t", trained())
    exported = drivetrain.export_weights(folder, str(tmp_path / "one.safetensors"))
    model = drivetrain.load_weights(drivetrain_numpy.LinearModel(3, 2, seed=4), exported, driver="numpy")
    np.testing.assert_array_equal(predictions(model), predictions(source))


def test_a_training_checkpoint_resumes_only_in_its_own_framework(tmp_path):
    trainer = fresh_trainer("numpy", trained())
    folder = str(tmp_path / "ckpt")
    trainer.save_checkpoint(folder)
    other = fresh_trainer("numpy_t")
    with pytest.raises(CheckpointError, match="resumes only in the framework that wrote it") as caught:
        other.load_checkpoint(folder)
    assert f"trainer.load_model({folder!r})" in str(caught.value)
    other.load_model(folder)  # its weights do move
    np.testing.assert_array_equal(predictions(other.driver.model), predictions(trainer.driver.model))


# ------------------------------------------------------------------ refusals, before anything is copied
def test_a_shape_mismatch_is_refused_and_loads_nothing(tmp_path):
    _, folder = saved(tmp_path, model=trained(out_features=2))
    target = fresh_trainer("numpy_t", drivetrain_numpy.LinearModel(3, 4, seed=9))
    before = {k: v.copy() for k, v in target.driver.model.params.items()}
    with pytest.raises(CheckpointError, match=r"shapes differ.*'weight': file \[4, 2\]|shapes differ") as caught:
        target.load_model(folder)
    assert "nothing was loaded" in str(caught.value)
    for name, value in target.driver.model.params.items():
        np.testing.assert_array_equal(value, before[name])


def test_unmatched_names_are_listed_with_a_guess_and_the_name_map_fix(tmp_path):
    _, folder = saved(tmp_path)
    target = fresh_trainer("numpy_t")
    before = target.driver.model.params["weight"].copy()
    with pytest.raises(CheckpointError) as caught:
        target.load_model(folder, name_map={"weight": "weights"})
    text = str(caught.value)
    assert "in the file, not in the model: 'weights' (stored as 'weight') (did you mean 'weight'?)" in text
    assert "in the model, not in the file: 'weight'" in text and "Check name_map" in text
    np.testing.assert_array_equal(target.driver.model.params["weight"], before)


def test_name_map_renames_as_a_dict_or_a_function(tmp_path):
    source, folder = saved(tmp_path, "numpy_t", trained())
    renamed = str(tmp_path / "renamed")
    drivetrain.convert_weights(folder, "numpy", renamed, name_map=lambda name: f"head.{name}")
    with safetensors.safe_open(os.path.join(renamed, "model.safetensors"), "np") as f:
        assert sorted(f.keys()) == ["head.bias", "head.weight"]
    with open(os.path.join(renamed, "manifest.json")) as f:
        assert json.load(f)["module_classes"] == {"head": ["LinearModel"]}  # the classes follow the new names
    model = drivetrain.load_weights(drivetrain_numpy.LinearModel(3, 2, seed=1), renamed, driver="numpy",
                                    name_map={"head": ""})
    np.testing.assert_array_equal(predictions(model), predictions(source))


@pytest.mark.parametrize("bad", [["weight"], {"weight": 3}, "weight"])
def test_a_malformed_name_map_is_refused_naming_the_argument(tmp_path, bad):
    _, folder = saved(tmp_path)
    with pytest.raises(ConfigurationError, match="name_map="):
        fresh_trainer("numpy_t").load_model(folder, name_map=bad)


def test_a_name_map_function_must_return_a_name(tmp_path):
    _, folder = saved(tmp_path)
    with pytest.raises(ConfigurationError, match=r"name_map\('(weight|bias)'\) returned None"):
        fresh_trainer("numpy_t").load_model(folder, name_map=lambda name: None)


# ------------------------------------------------------------------ converting without a model
def test_convert_writes_the_target_drivers_folder(tmp_path, capsys):
    source, folder = saved(tmp_path)
    out = str(tmp_path / "converted")
    assert main(["convert", folder, "--to", "numpy_t", "-o", out]) == 1  # numpy records no module classes
    assert "Load it into a model instead" in capsys.readouterr().err and not os.path.exists(out)
    via_t = str(tmp_path / "via-t")
    fresh_trainer("numpy_t", drivetrain_numpy.LinearModel(3, 2)).save_model(via_t)  # records LinearModel
    assert main(["convert", via_t, "--to", "numpy", "-o", out]) == 0
    assert "wrote" in capsys.readouterr().out
    with safetensors.safe_open(os.path.join(out, "model.safetensors"), "np") as f:
        assert sorted(f.keys()) == ["bias", "weight"] and f.get_tensor("weight").shape == (3, 2)
    again = str(tmp_path / "again")
    drivetrain.convert_weights(out, "numpy_t", again)  # the converted folder carries the classes on
    trainer = fresh_trainer("numpy_t")
    trainer.load_model(again)  # a numpy_t folder now: the same-framework path
    np.testing.assert_array_equal(trainer.driver.model.params["weight"], drivetrain_numpy.LinearModel(3, 2).params["weight"])


def test_convert_refuses_an_unknown_driver_and_a_same_driver_copy(tmp_path, capsys):
    _, folder = saved(tmp_path)
    assert main(["convert", folder, "--to", "nmupy", "-o", str(tmp_path / "x")]) == 1
    assert "'numpy'" in capsys.readouterr().err
    with pytest.raises(ConfigurationError, match="nothing to convert"):
        drivetrain.convert_weights(folder, "numpy", str(tmp_path / "y"))


def _paddle_like_file(path: str) -> dict[str, np.ndarray]:
    """A BatchNorm + Linear model file as paddle writes it, with a bf16 weight (raw uint16) in the Linear."""
    tensors = {"fc.weight": np.arange(6, dtype=np.float32).reshape(2, 3), "fc.bias": np.ones(3, np.float32),
               "bn._mean": np.full(2, 0.5, np.float32), "bn._variance": np.full(2, 2.0, np.float32),
               "bn.weight": np.ones(2, np.float32), "emb.weight": np.arange(8, dtype=np.float32).reshape(4, 2)}
    metadata = {"drivetrain_driver": "paddle_like", "weight_layout": json.dumps(PADDLE_LIKE.to_json()),
                "module_classes": json.dumps({"fc": ["Linear", "Layer"], "bn": ["BatchNorm2D", "Layer"],
                                              "emb": ["Embedding", "Layer"]})}
    safetensors.numpy.save_file(tensors, path, metadata=metadata)
    return tensors


def test_rules_go_through_the_neutral_layout_and_fill_or_drop_counters(tmp_path):
    original = _paddle_like_file(str(tmp_path / "paddle.safetensors"))
    neutral = drivetrain.convert_weights(str(tmp_path / "paddle.safetensors"), "bn_counting", str(tmp_path / "n"))
    with safetensors.safe_open(os.path.join(neutral, "model.safetensors"), "np") as f:
        got = {k: f.get_tensor(k) for k in f.keys()}
    assert sorted(got) == ["bn.num_batches_tracked", "bn.running_mean", "bn.running_var", "bn.weight", "emb.weight",
                           "fc.bias", "fc.weight"]
    np.testing.assert_array_equal(got["fc.weight"], original["fc.weight"].T)  # Linear only: [in, out] -> [out, in]
    np.testing.assert_array_equal(got["emb.weight"], original["emb.weight"])  # an Embedding is not transposed
    np.testing.assert_array_equal(got["bn.running_var"], original["bn._variance"])
    assert got["bn.num_batches_tracked"].dtype == np.int64 and got["bn.num_batches_tracked"].shape == ()
    plain = drivetrain.convert_weights(neutral, "bn_plain", str(tmp_path / "p"))  # lacks the counter: dropped
    with safetensors.safe_open(os.path.join(plain, "model.safetensors"), "np") as f:
        assert "bn.num_batches_tracked" not in f.keys() and "bn.running_mean" in f.keys()


def test_a_transpose_moves_any_dtype_bit_exactly(tmp_path):
    path = str(tmp_path / "bf16.safetensors")
    raw = np.arange(6, dtype=np.uint16).reshape(2, 3) * 4097  # bf16 bit patterns, written as a BF16 tensor
    header = json.dumps({"fc.weight": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 12]},
                         "__metadata__": {"drivetrain_driver": "paddle_like",
                                          "weight_layout": json.dumps(PADDLE_LIKE.to_json()),
                                          "module_classes": json.dumps({"fc": ["Linear"]})}}).encode()
    with open(path, "wb") as f:
        f.write(len(header).to_bytes(8, "little") + header + raw.tobytes())
    out = drivetrain.convert_weights(path, "bn_counting", str(tmp_path / "out"))
    with open(os.path.join(out, "model.safetensors"), "rb") as f:
        data = f.read()
    length = int.from_bytes(data[:8], "little")
    entry = json.loads(data[8:8 + length])["fc.weight"]
    assert entry["dtype"] == "BF16" and entry["shape"] == [3, 2]
    begin, end = entry["data_offsets"]
    body = np.frombuffer(data[8 + length + begin:8 + length + end], dtype=np.uint16).reshape(3, 2)
    np.testing.assert_array_equal(body, raw.T)


def _tensor_file(path: str, name: str, tag: str, raw: np.ndarray, driver: str, layout: WeightLayout,
                 classes: dict) -> None:
    """A safetensors file of one tensor as driver ``driver`` writes it (its layout and module classes recorded)."""
    header = json.dumps({name: {"dtype": tag, "shape": list(raw.shape), "data_offsets": [0, raw.nbytes]},
                         "__metadata__": {"drivetrain_driver": driver, "weight_layout": json.dumps(layout.to_json()),
                                          "module_classes": json.dumps(classes)}}).encode()
    with open(path, "wb") as f:
        f.write(len(header).to_bytes(8, "little") + header + raw.tobytes())


def test_a_permuted_kernel_goes_to_the_neutral_layout_and_back_bit_exactly(tmp_path):
    hwio = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5)  # h, w, in, out
    _tensor_file(str(tmp_path / "hwio.safetensors"), "conv.kernel", "F32", hwio, "hwio_like", HWIO_LIKE,
                 {"conv": ["Conv", "Module"]})
    neutral = drivetrain.convert_weights(str(tmp_path / "hwio.safetensors"), "bn_counting", str(tmp_path / "n"))
    with safetensors.safe_open(os.path.join(neutral, "model.safetensors"), "np") as f:
        oihw = f.get_tensor("conv.weight")
    np.testing.assert_array_equal(oihw, hwio.transpose(3, 2, 0, 1))  # torch's [out, in, h, w]
    back = drivetrain.convert_weights(neutral, "hwio_like", str(tmp_path / "back"))
    with safetensors.safe_open(os.path.join(back, "model.safetensors"), "np") as f:
        np.testing.assert_array_equal(f.get_tensor("conv.kernel"), hwio)
    _tensor_file(str(tmp_path / "flat.safetensors"), "conv.kernel", "F32", hwio.reshape(6, 20), "hwio_like",
                 HWIO_LIKE, {"conv": ["Conv"]})
    with pytest.raises(CheckpointError, match=r"reorders its axes as \[3, 2, 0, 1\] expects a 4-D tensor"):
        drivetrain.convert_weights(str(tmp_path / "flat.safetensors"), "bn_counting", str(tmp_path / "bad"))


def test_a_source_written_before_layouts_needs_its_backend(tmp_path):
    path = str(tmp_path / "old.safetensors")
    safetensors.numpy.save_file({"weight": np.ones((3, 2), np.float32)}, path,
                                metadata={"drivetrain_driver": "mxnet"})
    with pytest.raises(CheckpointError, match="'mxnet'.*not installed here.*pip install drivetrain-mxnet"):
        drivetrain.load_weights(drivetrain_numpy.LinearModel(3, 2), path, driver="numpy")


# ------------------------------------------------------------------ declaring a layout
@pytest.mark.parametrize("make, message", [
    (lambda: TensorRule("bn._mean", neutral="running_mean"), "without dots"),
    (lambda: TensorRule("weight"), "changes nothing"),
    (lambda: TensorRule("weight", transpose=True, modules="Linear"), "tuple of class names"),
    (lambda: TensorRule("kernel", permute=(0, 2)), "ordering the axes"),
    (lambda: TensorRule("kernel", permute=(1, 0), transpose=True), "without transpose=True"),
    (lambda: WeightLayout(rules=[TensorRule("weight", transpose=True)]), "tuple of drivetrain.TensorRule"),
    (lambda: WeightLayout(lacks="num_batches_tracked"), "tuple of tensor names"),
])
def test_a_malformed_declaration_is_refused(make, message):
    with pytest.raises(ConfigurationError, match=message):
        make()


def test_a_layout_survives_its_manifest_record():
    for layout in (PADDLE_LIKE, HWIO_LIKE):
        assert WeightLayout.from_json(json.loads(json.dumps(layout.to_json())), "here") == layout
    with pytest.raises(ConfigurationError, match="here: the recorded weight layout is damaged"):
        WeightLayout.from_json({"rules": [{"neutral": "x"}]}, "here")


def test_a_spec_with_a_bad_layout_is_refused_by_discovery():
    class Sloppy:
        @hookimpl
        def drivetrain_driver_specs(self):
            return [DriverSpec(name="sloppy", framework="numpy", factory="json:loads", contract_versions=(1,),
                               weight_layout={"rules": []})]

    with pytest.warns(RuntimeWarning, match="weight_layout=.*must be a drivetrain.WeightLayout"):
        drivetrain.register_plugin(Sloppy(), name="sloppy-layout")
    assert "sloppy" not in drivetrain.available_drivers()
