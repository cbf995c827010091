"""The loops users run: Trainer (training, its step and its events), Evaluator, predict."""

from .evaluator import Evaluator
from .predict import load_predictions, predict
from .trainer import Trainer

__all__ = ["Evaluator", "Trainer", "load_predictions", "predict"]
