"""``call_through_wrapper``: a module's training method run inside a wrapper's forward (drivetrain.backend).

Plain Python stands in for the framework: a module whose call runs its ``forward``, and a
wrapper that records what ran inside its own forward, as DDP or paddle's group sharding
prepare the gradient reduction there.
"""

from __future__ import annotations

import pytest

from drivetrain.backend import call_through_wrapper


class Module:
    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def forward(self, x):
        return ("forward", x)

    def train_step(self, x, *, scale=1):
        return ("train_step", x * scale, self(x))  # a method calling self(...) reaches the real forward

    def broken_step(self, x):
        raise ValueError(f"bad batch {x}")


class Wrapper:
    def __init__(self, module: Module) -> None:
        self.module = module
        self.inside: list[str] = []

    def __call__(self, *args, **kwargs):
        self.inside.append("enter")
        try:
            return self.module(*args, **kwargs)
        finally:
            self.inside.append("exit")


def test_the_method_runs_inside_the_wrappers_forward_and_forward_comes_back() -> None:
    module = Module()
    wrapper = Wrapper(module)
    assert call_through_wrapper(wrapper, module, "train_step", (2,), {"scale": 3}) == ("train_step", 6, ("forward", 2))
    assert wrapper.inside == ["enter", "exit"]
    assert "forward" not in module.__dict__ and module(5) == ("forward", 5)


def test_an_instance_forward_is_put_back_even_when_the_method_raises() -> None:
    module = Module()
    own = module.__dict__["forward"] = lambda x: ("own", x)
    with pytest.raises(ValueError, match="bad batch 1"):
        call_through_wrapper(Wrapper(module), module, "broken_step", (1,), {})
    assert module.__dict__["forward"] is own
