"""drivetrain's DeepSpeed engine: ``driver="deepspeed"``, DeepSpeed ZeRO (stages 1-3) on torch models.

It is built on drivetrain-torch's extension API (:mod:`drivetrain_torch.extension`) and imports
nothing else of that backend. Importing this package imports neither torch nor deepspeed: the
driver module (:mod:`drivetrain_deepspeed.driver`) is loaded only when ``driver="deepspeed"`` is chosen.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
