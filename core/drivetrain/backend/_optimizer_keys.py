"""An optimizer's state keyed by parameter index (one process's ``state_dict()``) or by parameter name.

A single process's optimizer numbers its parameters in the order of its param groups, and
the one-file checkpoints hold that form; an engine that shards the model (FSDP, ZeRO) and
the sharded checkpoints name each parameter instead, because the numbering means nothing
across a different layout. These two turn one form into the other.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def optimizer_state_by_name(state: Mapping[str, Any], order: Sequence[str]) -> dict[str, Any]:
    """``state`` (keyed by parameter index, int or its string) keyed by parameter name; ``order[i]`` names
    parameter ``i``."""
    return {"state": {order[int(i)]: value for i, value in state["state"].items()},
            "param_groups": [{**group, "params": [order[int(i)] for i in group["params"]]}
                             for group in state["param_groups"]]}


def optimizer_state_by_index(state: Mapping[str, Any]) -> dict[str, Any]:
    """The inverse of :func:`optimizer_state_by_name`: the parameters numbered in the order of the param groups,
    as one process's ``state_dict()`` numbers them."""
    order = [name for group in state["param_groups"] for name in group["params"]]
    index = {name: i for i, name in enumerate(order)}
    return {"state": {index[name]: value for name, value in state["state"].items()},
            "param_groups": [{**group, "params": [index[name] for name in group["params"]]}
                             for group in state["param_groups"]]}
