"""Accuracy: the share of positions whose predicted class equals the target."""

from __future__ import annotations

from typing import Any

from .base import Metric, prepare_labels


class Accuracy(Metric):
    """``{"acc": correct / total}`` over every counted position.

    ``update(pred, target, seq_len=None)``: ``pred`` is class ids shaped like
    ``target`` or scores with one more trailing dimension (argmax is taken);
    ``seq_len`` (shape ``(batch,)``) leaves out padded positions of sequence labels.
    With nothing counted (an empty evaluation set) ``acc`` is 0.0, not NaN, so a
    monitor comparing results never sees a NaN.
    """

    result_names = ("acc",)

    def __init__(self) -> None:
        super().__init__()
        self.register_element("correct", 0.0, aggregate="sum")
        self.register_element("total", 0.0, aggregate="sum")

    def update(self, pred: Any, target: Any, seq_len: Any = None) -> None:
        """Count the correct positions of one batch.

        Args:
            pred: class ids shaped like ``target``, or scores with one more trailing dimension (argmax is taken).
            target: the true class ids.
            seq_len: each row's length, shape ``(batch,)``: padded positions past it are not counted.

        Raises:
            MetricInputError: the shapes disagree.
        """
        pred_ids, target_ids = prepare_labels(pred, target, seq_len, metric="Accuracy")
        self.correct += (pred_ids == target_ids).sum()
        self.total += target_ids.size

    def get_metric(self) -> dict[str, float]:
        """The accuracy of the positions counted.

        Returns:
            ``{"acc": correct / total}`` (0.0 when nothing was counted).
        """
        total = float(self.total)
        return {"acc": float(self.correct) / total if total else 0.0}
