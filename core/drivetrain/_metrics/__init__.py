"""Evaluation metrics: numpy state that aggregates across processes through the driver."""

from .accuracy import Accuracy
from .base import AGGREGATES, Metric, MetricInputError
from .classify_fpr import ClassifyFPreRecMetric

__all__ = ["AGGREGATES", "Accuracy", "ClassifyFPreRecMetric", "Metric", "MetricInputError"]
