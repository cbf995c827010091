"""Run records: loggers, the recorder callback that feeds them, and the history a Trainer keeps."""

from .files import CSVLogger, JSONLinesLogger
from .logger import Logger
from .mlflow_logger import MLflowLogger
from .plot import DEFAULT_NAME, plot_runs
from .recorder import DEFAULT_EVERY, HistoryRecorder, RunRecorder
from .registry import logger_names, make_loggers
from .tensorboard import TensorBoardLogger
from .visualdl_logger import VisualDLLogger
from .wandb_logger import WandbLogger

__all__ = [
    "CSVLogger", "DEFAULT_EVERY", "DEFAULT_NAME", "HistoryRecorder", "JSONLinesLogger", "Logger",
    "MLflowLogger", "RunRecorder", "TensorBoardLogger", "VisualDLLogger", "WandbLogger", "logger_names",
    "make_loggers", "plot_runs"
]
