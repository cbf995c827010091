"""The saved-state checks and loaders every backend words the same way (drivetrain.backend), and reading
bfloat16 tensors for a framework without it in its numpy bridge."""

from __future__ import annotations

import re

import numpy as np
import pytest

from drivetrain.backend import (
    DriverError,
    bf16_bits,
    check_gradient_names,
    check_gradient_shape,
    check_rng_state_keys,
    check_scaler_values,
    check_state_shape,
    checked_cuda_index,
    loadable_gradients,
    loadable_model_state,
    optimizer_state_for_load,
    scaler_state_to_load,
    warn_device_states,
    widened_tensors,
)


def test_gradient_names_must_be_a_mapping_of_the_models_parameters() -> None:
    check_gradient_names({"w": 1}, {"w", "b"}, "Net")  # leaving a parameter out is fine
    with pytest.raises(DriverError, match=r"^load_gradient_state\(grads=list\) needs a dict of parameter name"):
        check_gradient_names([], {"w"}, "Net")
    with pytest.raises(DriverError, match=r"the model Net has no parameter\(s\) \['x'\]; the gradients were saved"):
        check_gradient_names({"w": 1, "x": 2}, {"w"}, "Net")


def test_shapes_are_shown_as_the_backend_gives_them() -> None:
    check_state_shape("w", (2, 3), (2, 3))
    check_gradient_shape("w", [2], [2])
    with pytest.raises(DriverError, match=r"^state\['w'\] has shape \(2, 2\) but the model's 'w' has shape \(2, 3\);"):
        check_state_shape("w", (2, 2), (2, 3))
    with pytest.raises(DriverError, match=r"^load_gradient_state: grads\['b'\] has shape \[3\] but the parameter "
                                          r"has shape \[2\]; the gradients were saved from a differently sized"):
        check_gradient_shape("b", [3], [2])


class _T:
    """A stand-in tensor: a shape and a dtype, nothing framework-specific."""

    def __init__(self, shape: tuple[int, ...], dtype: str = "f32") -> None:
        self.shape, self.dtype = shape, dtype


def _as_tensor(value: object, where: str) -> _T:
    if not isinstance(value, _T):
        raise DriverError(f"{where} is a {type(value).__name__}; the test driver needs tensors.")
    return value


def test_loadable_model_state_checks_names_then_each_entry_and_casts() -> None:
    expected = {"w": _T((2, 3)), "b": _T((3,), "f16")}
    out = loadable_model_state({"w": _T((2, 3)), "b": _T((3,))}, expected, "Net", as_tensor=_as_tensor,
                               shape=lambda t: tuple(t.shape), cast=lambda t, dtype: _T(t.shape, dtype))
    assert [(n, t.dtype) for n, t in out.items()] == [("w", "f32"), ("b", "f16")]
    with pytest.raises(DriverError, match=r"missing key\(s\) \['b'\].*Was it saved.* hint here"):
        loadable_model_state({"w": _T((2, 3))}, expected, "Net", as_tensor=_as_tensor, shape=lambda t: t.shape,
                             hint="hint here")
    with pytest.raises(DriverError, match=r"^state\['w'\] is a int; the test driver"):
        loadable_model_state({"w": 1, "b": _T((3,))}, expected, "Net", as_tensor=_as_tensor, shape=lambda t: t.shape)
    with pytest.raises(DriverError, match=r"^state\['w'\] has shape \[2, 2\] but the model's 'w' has shape \[2, 3\]"):
        loadable_model_state({"w": _T((2, 2)), "b": _T((3,))}, expected, "Net", as_tensor=_as_tensor,
                             shape=lambda t: list(t.shape))


def test_loadable_gradients_checks_and_places_each_gradient() -> None:
    params = {"w": _T((2,)), "b": _T((1,))}
    out = loadable_gradients({"w": _T((2,))}, params, "Net", as_tensor=_as_tensor, shape=lambda t: t.shape,
                             place=lambda grad, param: ("placed", param))
    assert out == {"w": ("placed", params["w"])}
    with pytest.raises(DriverError, match=r"^load_gradient_state: grads\['w'\] is a str; the test driver"):
        loadable_gradients({"w": "x"}, params, "Net", as_tensor=_as_tensor, shape=lambda t: t.shape,
                           place=lambda grad, param: grad)
    with pytest.raises(DriverError, match=r"^load_gradient_state: grads\['b'\] has shape \(3,\) but the parameter"):
        loadable_gradients({"b": _T((3,))}, params, "Net", as_tensor=_as_tensor, shape=lambda t: t.shape,
                           place=lambda grad, param: grad)
    with pytest.raises(DriverError, match=r"the model Net has no parameter\(s\) \['x'\]"):
        loadable_gradients({"x": _T((1,))}, params, "Net", as_tensor=_as_tensor, shape=lambda t: t.shape,
                           place=lambda grad, param: grad)


def test_optimizer_state_for_load_restores_int_keys_and_checks_them() -> None:
    state = {"state": {"0": {"m": 1}, 1: {"m": 2}}, "param_groups": [{"params": [0, 1], "lr": 0.1}]}
    out = optimizer_state_for_load(state, "optimizers[0]", "torch")
    assert out["state"] == {0: {"m": 1}, 1: {"m": 2}} and out["param_groups"] == state["param_groups"]
    copied = optimizer_state_for_load(state, "o", "torch", copy=lambda v: ("copy", v))
    assert copied["state"][0] == ("copy", {"m": 1})
    with pytest.raises(DriverError, match=r"^optimizers\[0\] is a list without 'state' and 'param_groups'; it must "
                                          r"be a torch optimizer's state_dict\(\)"):
        optimizer_state_for_load([], "optimizers[0]", "torch")
    damaged = {"state": {"5": {}}, "param_groups": [{"params": [0]}]}
    with pytest.raises(DriverError, match=r"^o\['state'\] has an entry for parameter '5', which none of its"):
        optimizer_state_for_load(damaged, "o", "torch")
    plain = {"state": {"step": 3, "0": {}}, "param_groups": [{"params": [0]}]}
    with pytest.raises(DriverError, match=r"entry for parameter 'step'"):
        optimizer_state_for_load(plain, "o", "torch")
    assert optimizer_state_for_load(plain, "o", "oneflow", plain_entries=True)["state"] == {"step": 3, 0: {}}


def _load_scaler(state: object, scaler: bool, expected: bool = True) -> object:
    return scaler_state_to_load(state, scaler=scaler, expected=expected, missing="no state here", ignored="ignored")


def test_scaler_state_to_load_warns_refuses_or_passes_the_state_on() -> None:
    assert _load_scaler({"scale": 2.0}, True) == {"scale": 2.0}
    with pytest.warns(UserWarning, match="^no state here$"):
        assert _load_scaler(None, True) is None
    assert _load_scaler(None, True, expected=False) is None  # no warning (-W error would raise)
    assert _load_scaler(None, False, expected=False) is None
    with pytest.warns(UserWarning, match="^ignored$"):
        assert _load_scaler({"scale": 2.0}, False) is None
    assert _load_scaler({}, False) is None  # an empty state: nothing ignored, no warning
    with pytest.raises(DriverError, match=r"^load_precision_state\(state=list\) needs the dict returned by"):
        _load_scaler([], True)


_SCALER = {"scale": "float > 0: the first scale", "grow": "float > 1: the growth", "shrink": "float in (0, 1): the backoff",
           "every": "int >= 1: steps between growths", "dynamic": "bool: adapt the scale"}


@pytest.mark.parametrize(("key", "good", "bad"), [
    ("scale", [1e-3, 65536, 1.0], [0, -1.0, float("inf"), float("nan"), True, "1"]),
    ("grow", [2, 1.5], [1, 1.0, 0.5, float("inf")]),
    ("shrink", [0.5, 0.99], [0, 1, 1.0, -0.5, float("nan")]),
    ("every", [1, 2000], [0, -3, 1.5, True, "2"]),
    ("dynamic", [True, False], [1, 0, None]),
])
def test_scaler_values_follow_the_rule_their_description_starts_with(key, good, bad) -> None:
    for value in good:
        check_scaler_values({key: value}, _SCALER, "solo_kwargs")
    for value in bad:
        message = f"solo_kwargs['{key}']={value!r} is not accepted; it must be {_SCALER[key]}."
        with pytest.raises(DriverError, match=f"^{re.escape(message)}$"):
            check_scaler_values({key: value}, _SCALER, "solo_kwargs")


def test_a_scaler_description_without_a_rule_is_the_backends_mistake() -> None:
    with pytest.raises(ValueError, match=r"the description of 'scale' \('first scale'\) must start with one of "
                                         r"\['float > 0', "):
        check_scaler_values({"scale": 1.0}, {"scale": "first scale"}, "solo_kwargs")


def test_rng_state_keys_and_device_counts() -> None:
    check_rng_state_keys({"cpu": 1, "cuda": []}, ("cpu", "cuda"), "torch")
    with pytest.raises(DriverError, match=r"^load_rng_state\(state=\[\]\) needs the dict returned by rng_state\(\), "
                                          r"with a 'cpu' entry\.$"):
        check_rng_state_keys([], ("cpu", "cuda"), "torch")
    with pytest.raises(DriverError, match=r"unknown entr\(ies\) \['x'\]; the oneflow driver saves 'cpu', 'cuda' "
                                          r"and 'modules'\.$"):
        check_rng_state_keys({"cpu": 1, "x": 2}, ("cpu", "cuda", "modules"), "oneflow")
    with pytest.raises(DriverError, match=r"the solo driver saves 'cpu'\.$"):
        check_rng_state_keys({"cpu": 1, "x": 2}, ("cpu",), "solo")
    with pytest.raises(DriverError, match=r"needs the dict returned by rng_state\(\), with 'seed' and 'engine'\.$"):
        check_rng_state_keys({"seed": 1}, ("seed", "engine"), "jittor", required=("seed", "engine"))
    assert warn_device_states(2, 2, "CUDA") == 2
    with pytest.warns(UserWarning, match=r"holds GPU random states for 3 device\(s\) but this machine has 1; "
                                         r"restoring the first 1\."):
        assert warn_device_states(3, 1, "GPU") == 1


def test_checked_cuda_index() -> None:
    assert checked_cuda_index("cuda", None, 2, lambda: 1) == 1
    assert checked_cuda_index("cuda:0", 0, 1, lambda: 0) == 0
    with pytest.raises(DriverError, match=r"^device='cuda:2': cuda:2 does not exist, this process sees 2 CUDA "
                                          r"device\(s\) \(valid: cuda:0, cuda:1\)\. Check CUDA_VISIBLE_DEVICES\.$"):
        checked_cuda_index("cuda:2", 2, 2, lambda: 0)
    with pytest.raises(DriverError, match=r"^device=3: gpu:3 does not exist, this process sees 1 GPU\(s\) \(valid: "
                                          r"gpu:0\)\. Check CUDA_VISIBLE_DEVICES\.$"):
        checked_cuda_index(3, 3, 1, lambda: 0, spelling="gpu", noun="GPU(s)")


def test_widened_tensors_read_bfloat16_through_float32() -> None:
    values = np.array([1.5, -2.0, 3.140625], dtype=np.float32)  # exact bfloat16 values
    entries = [("w", {"dtype": "BF16", "shape": [3], "data": bf16_bits(values).tobytes()}),
               ("n", {"dtype": "I64", "shape": [2], "data": np.array([1, 2], "<i8").tobytes()})]
    out = widened_tensors(entries, ("BF16", "I64"), "the solo driver cannot load", np.array, lambda a: ("bf16", a))
    assert out["w"][0] == "bf16" and out["w"][1].dtype == np.float32 and np.array_equal(out["w"][1], values)
    assert out["n"].dtype == np.int64 and out["n"].tolist() == [1, 2]
    with pytest.raises(DriverError, match=r"^tensor 'n' has dtype I64, which the solo driver cannot load\.$"):
        widened_tensors(entries, ("BF16",), "the solo driver cannot load", np.array, lambda a: a)
