"""The checks a driver runs before it loads a sharded checkpoint: nothing is copied unless everything fits.

Every driver that reads sharded checkpoints (drivetrain-torch's, and engines built on it such as
drivetrain-deepspeed's) compares the same things the same way: the model's keys and shapes,
and each optimizer's param groups by parameter name. A mismatch raises a
:class:`~drivetrain.CheckpointError` naming the difference and the fix.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .folder import CheckpointError
from .shard_layout import ShardSource


def check_shard_model(model: Mapping[str, Any], source: ShardSource) -> None:
    """``model`` (``{state name: tensor}``, anything with a ``shape``) against the checkpoint's model: the same
    names (frozen parameters the checkpoint left out aside) and shapes."""
    saved = source.model_keys()
    missing, unexpected = sorted(set(model) - set(saved) - source.frozen), sorted(set(saved) - set(model))
    if missing or unexpected:
        raise CheckpointError(
            f"{source.folder}: the saved model does not match this model; missing {missing[:10]}, unexpected "
            f"{unexpected[:10]}. Build the same model architecture as the run that saved it."
        )
    wrong = [(k, saved[k], tuple(t.shape)) for k, t in model.items() if k in saved and saved[k] != tuple(t.shape)]
    if wrong:
        raise CheckpointError(f"{source.folder}: shapes differ (name, saved, model): {wrong[:10]}.")


def check_shard_optimizers(source: ShardSource, groups: Sequence[Sequence[Sequence[str]]]) -> list[dict[str, Any]]:
    """The checkpoint's optimizer metas, one per optimizer, each saved over the same param groups as this run's:
    ``groups[i]`` is optimizer ``i``'s groups, each the names of its parameters."""
    metas = source.meta.get("optimizers") if isinstance(source.meta, dict) else None
    if not isinstance(metas, list) or len(metas) != len(groups):
        raise CheckpointError(
            f"{source.folder} holds {len(metas) if isinstance(metas, list) else 'no'} optimizer state(s) but the "
            f"trainer has {len(groups)} optimizer(s); pass the same optimizers as the run that saved it."
        )
    for index, (current, meta) in enumerate(zip(groups, metas, strict=True)):
        saved = [list(g["params"]) for g in meta["param_groups"]]
        if saved != [list(names) for names in current]:
            raise CheckpointError(
                f"{source.folder}: optimizers[{index}] was saved over other parameters or groups (saved groups "
                f"{[len(g) for g in saved]} parameters, this one {[len(g) for g in current]}); build the optimizer "
                "over the same parameters, in the same groups, as the run that saved it. Nothing was loaded."
            )
    return metas
