"""Run records: the loggers a Trainer feeds (``Trainer(loggers=[...], log_every_n_steps=50)``).

Built-ins, each also named by a string in ``loggers=``: :class:`CSVLogger` (``"csv"``) and
:class:`JSONLinesLogger` (``"jsonl"``), which need nothing; :class:`TensorBoardLogger`
(``"tensorboard"``, needs ``tensorboardX``), :class:`VisualDLLogger` (``"visualdl"``, needs
``visualdl``), :class:`MLflowLogger` (``"mlflow"``, needs ``mlflow-skinny`` with
``sqlalchemy`` and ``alembic`` for its local store) and :class:`WandbLogger` (``"wandb"``,
needs ``wandb``; offline works without an account). Each dependency is imported only when a
run uses its logger. Subclass :class:`Logger` for your own, or
publish one by name through the ``drivetrain_loggers`` hook of a plugin's entry point.
"""

from ._common import check_keywords
from ._records import (
    CSVLogger,
    JSONLinesLogger,
    Logger,
    MLflowLogger,
    TensorBoardLogger,
    VisualDLLogger,
    WandbLogger,
    logger_names,
)

for _public in (Logger, CSVLogger, JSONLinesLogger, MLflowLogger, TensorBoardLogger, VisualDLLogger, WandbLogger):
    check_keywords(_public)  # a misspelt keyword gets the closest accepted name

__all__ = ["CSVLogger", "JSONLinesLogger", "Logger", "MLflowLogger", "TensorBoardLogger", "VisualDLLogger",
           "WandbLogger", "logger_names"]
