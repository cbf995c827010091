"""Run records: the loggers a Trainer feeds (``Trainer(loggers=[...], log_every_n_steps=50)``).

Built-ins, each also named by a string in ``loggers=``: :class:`CSVLogger` (``"csv"``) and
:class:`JSONLinesLogger` (``"jsonl"``), which need nothing, and :class:`TensorBoardLogger`
(``"tensorboard"``), which needs ``tensorboardX``. Subclass :class:`Logger` for your own, or
publish one by name through the ``drivetrain_loggers`` hook of a plugin's entry point.
"""

from ._records.files import CSVLogger, JSONLinesLogger
from ._records.logger import Logger
from ._records.registry import logger_names
from ._records.tensorboard import TensorBoardLogger

__all__ = ["CSVLogger", "JSONLinesLogger", "Logger", "TensorBoardLogger", "logger_names"]
