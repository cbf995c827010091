"""``drivetrain.load_weights``: a model folder of any framework into a bare model, no Trainer needed."""

from __future__ import annotations

import os
from typing import Any

from .._convert import NameMap
from ..backend import Driver, create_driver
from .trainer_io import load_weights_into


def load_weights(model: Any, folder: str | os.PathLike, *, driver: str | Driver = "auto",
                 name_map: NameMap = None, source_driver: str | None = None) -> Any:
    """Load the weights of ``folder`` into ``model`` and return the model.

    ``folder`` is a folder written by ``save_model``/``save_checkpoint``/``CheckpointCallback``
    or a file written by ``drivetrain export``, by the same framework's driver or another's:
    paddle weights go into a torch model and back, each backend's declared layout rules
    (transposed Linear weights, BatchNorm statistics' names) applied on the way. Every name and
    shape is matched before anything is copied. ``driver`` is the model's driver (``"auto"``
    picks it from the model's class); the model stays on its device. ``name_map`` renames:
    ``{"encoder": "backbone"}`` (module path or tensor name in the file -> in the model) or a
    function of the tensor name. A plain ``.safetensors`` file that does not say which framework
    wrote it (a Hugging Face ``model.safetensors``) is read in the model's own layout unless
    ``source_driver`` names the one it is in. Example::

        model = drivetrain.load_weights(PaddleNet(), "runs/torch_model")
        model = drivetrain.load_weights(PaddleNet(), "hf/model.safetensors", source_driver="torch")

    Args:
        model: the model to fill, of any installed backend's framework.
        folder: a model or checkpoint folder, or an exported ``.safetensors`` file.
        driver: the model's driver (``"auto"`` picks it from the model's class) or a Driver.
        name_map: renames from the file's names to the model's: a dict or a function of the name.
        source_driver: the driver whose layout a file without drivetrain's metadata is in (``"torch"``
            for a Hugging Face file); a folder or file that records its driver must record this one.

    Returns:
        ``model``, its weights replaced.

    Raises:
        CheckpointError: a name or shape does not match (nothing is copied), a damaged folder, or a
            training checkpoint of another framework.
    """
    built = create_driver(driver, model, None)
    load_weights_into(built, folder, name_map, source_driver)
    return model
