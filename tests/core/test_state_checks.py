"""The saved-state checks every backend words the same way (drivetrain.backend)."""

from __future__ import annotations

import pytest

from drivetrain.backend import DriverError, check_gradient_names, check_gradient_shape, check_state_shape


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
