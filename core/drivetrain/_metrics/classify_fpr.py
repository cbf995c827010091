"""F-score, precision and recall for single-label classification (and sequence labelling per token)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from .._common import ConfigurationError
from .base import Metric, MetricInputError, prepare_labels

F_TYPES = ("micro", "macro")


class ClassifyFPreRecMetric(Metric):
    """Precision, recall and F-beta from per-class true-positive, false-positive and false-negative counts.

    The number of classes is fixed at construction (``num_classes``, or the length
    of ``tag_vocab``) because the count arrays must have the same shape on every
    process to be summed across them.

    Args:
        num_classes: how many classes; labels are ids in ``[0, num_classes)``.
        tag_vocab: label names, a sequence (index = class id) or a ``{name: id}`` mapping;
            used for per-label keys and to name ``ignore_labels``.
        ignore_labels: classes left out of every result (e.g. an "O" tag), by name or id.
        only_gross: return only ``f``, ``pre``, ``rec``; when False also ``f-<label>``,
            ``pre-<label>``, ``rec-<label>`` for every class not ignored.
        f_type: ``"micro"`` sums counts over classes first; ``"macro"`` averages per-class
            scores over the classes that occurred in target or pred.
        beta: weight of recall in the F score (1 gives F1).

    A ratio with a zero denominator is 0.0 (no warning).
    """

    def __init__(
        self,
        num_classes: int | None = None,
        tag_vocab: Sequence[str] | Mapping[str, int] | None = None,
        ignore_labels: Iterable[str | int] | None = None,
        only_gross: bool = True,
        f_type: str = "micro",
        beta: float = 1,
    ) -> None:
        super().__init__()
        self.label_names = _label_names(num_classes, tag_vocab)
        self.num_classes = len(self.label_names)
        if f_type not in F_TYPES:
            raise ConfigurationError(f"f_type={f_type!r} is not accepted; use one of {', '.join(F_TYPES)}.")
        if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not beta > 0:
            raise ConfigurationError(f"beta={beta!r} is not accepted; pass a positive number (1 gives F1).")
        if not isinstance(only_gross, bool):
            raise ConfigurationError(f"only_gross={only_gross!r} is not accepted; pass True or False.")
        self.f_type = f_type
        self.beta = float(beta)
        self.only_gross = only_gross
        ignored = _ignored_ids(ignore_labels, self.label_names)
        self.kept = np.array([i for i in range(self.num_classes) if i not in ignored], dtype=np.int64)
        if self.kept.size == 0:
            raise ConfigurationError(
                f"ignore_labels={ignore_labels!r} ignores every one of the {self.num_classes} classes; "
                "leave at least one class."
            )
        zeros = np.zeros(self.num_classes, dtype=np.int64)
        self.register_element("tp", zeros, aggregate="sum")
        self.register_element("fp", zeros, aggregate="sum")
        self.register_element("fn", zeros, aggregate="sum")

    @property
    def result_names(self) -> tuple[str, ...]:  # type: ignore[override]  # computed; the base's is a class attribute
        """The keys :meth:`get_metric` returns: ``f``, ``pre``, ``rec``, plus one of each per kept label unless
        ``only_gross``."""
        names = ["f", "pre", "rec"]
        if not self.only_gross:
            for i in self.kept:
                label = self.label_names[i]
                names += [f"f-{label}", f"pre-{label}", f"rec-{label}"]
        return tuple(names)

    def update(self, pred: Any, target: Any, seq_len: Any = None) -> None:
        """Add one batch's true positives, false positives and false negatives per class.

        Args:
            pred: predicted class ids, or scores with a trailing class dimension (argmax is taken).
            target: the true class ids, each in ``[0, num_classes)``.
            seq_len: each row's length, shape ``(batch,)``, for sequence labelling: padding is left out.

        Raises:
            MetricInputError: the shapes disagree or an id is not a class.
        """
        pred_ids, target_ids = prepare_labels(
            pred, target, seq_len, metric="ClassifyFPreRecMetric", num_classes=self.num_classes
        )
        target_ids = self._class_ids("target", target_ids)
        pred_ids = self._class_ids("pred", pred_ids)
        hit = pred_ids == target_ids
        c = self.num_classes
        self.tp += np.bincount(target_ids[hit], minlength=c)
        self.fp += np.bincount(pred_ids[~hit], minlength=c)
        self.fn += np.bincount(target_ids[~hit], minlength=c)

    def _class_ids(self, name: str, ids: np.ndarray) -> np.ndarray:
        """``ids`` as int64 after checking each is a class id (integral floats are accepted)."""
        if ids.size == 0:
            return ids.astype(np.int64)
        c = self.num_classes
        integral = ids.dtype.kind in "iub" or (ids.dtype.kind == "f" and bool(np.all(ids == np.round(ids))))
        if not integral or ids.min() < 0 or ids.max() >= c:
            if integral:
                bad = ids[(ids < 0) | (ids >= c)]
            else:
                bad = ids[ids != np.round(ids)] if ids.dtype.kind == "f" else ids
            raise MetricInputError(
                f"ClassifyFPreRecMetric.update: {name} holds {bad[:5].tolist()} (dtype {ids.dtype}), but labels "
                f"must be integer ids in [0, {c}) (num_classes={c}). Mask padding with seq_len, or raise num_classes."
            )
        return ids.astype(np.int64, copy=False)

    def get_metric(self) -> dict[str, float]:
        """Precision, recall and F-beta over the kept labels (and per label unless ``only_gross``).

        Returns:
            ``{"f": ..., "pre": ..., "rec": ...}`` plus ``f-<label>``, ``pre-<label>``, ``rec-<label>`` keys.
        """
        tp, fp, fn = (np.asarray(a, dtype=np.float64)[self.kept] for a in (self.tp, self.fp, self.fn))
        pre, rec, f = _scores(tp, fp, fn, self.beta)
        if self.f_type == "micro":
            gross = _scores(tp.sum(), fp.sum(), fn.sum(), self.beta)
            results = {"f": float(gross[2]), "pre": float(gross[0]), "rec": float(gross[1])}
        else:
            seen = (tp + fp + fn) > 0
            n = seen.sum()
            results = {
                "f": float(f[seen].sum() / n) if n else 0.0,
                "pre": float(pre[seen].sum() / n) if n else 0.0,
                "rec": float(rec[seen].sum() / n) if n else 0.0,
            }
        if not self.only_gross:
            for j, i in enumerate(self.kept):
                label = self.label_names[i]
                results[f"f-{label}"] = float(f[j])
                results[f"pre-{label}"] = float(pre[j])
                results[f"rec-{label}"] = float(rec[j])
        return results

    def __repr__(self) -> str:
        return f"ClassifyFPreRecMetric(num_classes={self.num_classes}, f_type={self.f_type!r}, beta={self.beta})"


def _divide(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """num / den, with 0 where den is 0 (and no warning)."""
    num, den = np.asarray(num, dtype=np.float64), np.asarray(den, dtype=np.float64)
    return np.divide(num, den, out=np.zeros(np.broadcast(num, den).shape), where=den != 0)


def _scores(tp: Any, fp: Any, fn: Any, beta: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    pre = _divide(tp, tp + fp)
    rec = _divide(tp, tp + fn)
    b2 = beta * beta
    f = _divide((1 + b2) * pre * rec, b2 * pre + rec)
    return pre, rec, f


def _label_names(num_classes: Any, tag_vocab: Any) -> list[str]:
    """Names of classes ``0 .. n-1`` from ``num_classes`` and/or ``tag_vocab``; validates both."""
    if num_classes is not None and (
        isinstance(num_classes, bool) or not isinstance(num_classes, (int, np.integer)) or num_classes < 1
    ):
        raise ConfigurationError(f"num_classes={num_classes!r} is not accepted; pass a positive int.")
    if tag_vocab is None:
        if num_classes is None:
            raise ConfigurationError(
                "ClassifyFPreRecMetric needs the number of classes up front (its counts are summed across "
                "processes, so their shape must be fixed): pass num_classes=<int> or tag_vocab=[label names]."
            )
        return [str(i) for i in range(int(num_classes))]
    if isinstance(tag_vocab, Mapping):
        ids = sorted(tag_vocab.values()) if all(isinstance(v, (int, np.integer)) for v in tag_vocab.values()) else None
        if ids != list(range(len(tag_vocab))):
            raise ConfigurationError(
                f"tag_vocab={dict(tag_vocab)!r}: a mapping must send label names to the ids 0..{len(tag_vocab) - 1}, "
                "each used once."
            )
        names = [""] * len(tag_vocab)
        for name, idx in tag_vocab.items():
            names[int(idx)] = str(name)
    elif isinstance(tag_vocab, Sequence) and not isinstance(tag_vocab, (str, bytes)):
        names = [str(name) for name in tag_vocab]
    else:
        raise ConfigurationError(
            f"tag_vocab={tag_vocab!r} is not accepted; pass a list of label names (index = class id), "
            "a {name: id} dict, or None."
        )
    if not names:
        raise ConfigurationError("tag_vocab=[] is empty; pass at least one label name.")
    if len(set(names)) != len(names):
        dupes = sorted({n for n in names if names.count(n) > 1})
        raise ConfigurationError(f"tag_vocab has repeated label names {dupes}; each class needs its own name.")
    if num_classes is not None and num_classes != len(names):
        raise ConfigurationError(
            f"num_classes={num_classes} but tag_vocab has {len(names)} labels; pass one of them, or make them agree."
        )
    return names


def _ignored_ids(ignore_labels: Any, names: list[str]) -> set[int]:
    if ignore_labels is None:
        return set()
    if isinstance(ignore_labels, (str, int)):
        ignore_labels = [ignore_labels]
    ids: set[int] = set()
    for label in ignore_labels:
        if isinstance(label, str) and label in names:
            ids.add(names.index(label))
        elif isinstance(label, (int, np.integer)) and not isinstance(label, bool) and 0 <= label < len(names):
            ids.add(int(label))
        else:
            raise ConfigurationError(
                f"ignore_labels contains {label!r}, which is no class; accepted: label names {names[:10]}"
                f"{' ...' if len(names) > 10 else ''} or ids in [0, {len(names)})."
            )
    return ids
