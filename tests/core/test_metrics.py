"""Metrics: correctness against sklearn, masking, aggregation across fake ranks, bad inputs."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import precision_recall_fscore_support

from drivetrain._common.errors import ConfigurationError
from drivetrain._metrics import Accuracy, ClassifyFPreRecMetric, Metric, MetricInputError


def identity_all_reduce(array: np.ndarray, op: str) -> np.ndarray:
    return array


_REDUCE = {"sum": np.sum, "max": np.max, "min": np.min}


def both_ranks(metric_a: Metric, metric_b: Metric) -> None:
    """Aggregate two metrics as two processes would: the i-th all_reduce call of each meets the other's."""
    before = [list(metric_a.elements.values()), list(metric_b.elements.values())]
    for rank, metric in enumerate((metric_a, metric_b)):
        calls = iter(range(len(before[rank])))

        def all_reduce(array: np.ndarray, op: str, rank: int = rank, calls=calls) -> np.ndarray:
            i = next(calls)
            np.testing.assert_array_equal(array, before[rank][i])
            return _REDUCE[op](np.stack([before[0][i], before[1][i]]), axis=0)

        metric.aggregate(all_reduce)


# --------------------------------------------------------------------- Metric base
class CountMax(Metric):
    result_names = ("n", "peak", "low")

    def __init__(self) -> None:
        super().__init__()
        self.register_element("n", 0.0)
        self.register_element("peak", -np.inf, aggregate="max")
        self.register_element("low", np.inf, aggregate="min")

    def update(self, pred: np.ndarray) -> None:
        self.n += pred.size
        self.peak = max(self.peak, pred.max())
        self.low = min(self.low, pred.min())

    def get_metric(self) -> dict[str, float]:
        return {"n": float(self.n), "peak": float(self.peak), "low": float(self.low)}


def test_elements_read_write_reset_and_all_ops():
    a, b = CountMax(), CountMax()
    a.update(np.array([1.0, 5.0]))
    b.update(np.array([-3.0, 2.0, 4.0]))
    assert isinstance(a.n, np.ndarray) and a.n.shape == ()
    both_ranks(a, b)
    assert a.get_metric() == b.get_metric() == {"n": 5.0, "peak": 5.0, "low": -3.0}
    a.reset()
    assert a.get_metric() == {"n": 0.0, "peak": -np.inf, "low": np.inf}
    a.update(np.array([7.0]))
    a.reset()
    assert float(a.n) == 0.0  # reset restores a copy, not the mutated array


def test_aggregate_with_identity_is_a_no_op():
    m = CountMax()
    m.update(np.array([2.0, 3.0]))
    m.aggregate(identity_all_reduce)
    assert m.get_metric() == {"n": 2.0, "peak": 3.0, "low": 2.0}


def test_register_element_errors():
    class Early(Metric):
        def __init__(self) -> None:
            self.register_element("x")

        def update(self) -> None: ...
        def get_metric(self) -> dict[str, float]:
            return {}

    with pytest.raises(ConfigurationError, match="super\\(\\).__init__"):
        Early()

    class Bad(Metric):
        def __init__(self, name: str, value=0.0, aggregate: str = "sum") -> None:
            super().__init__()
            self.register_element("ok")
            self.register_element(name, value, aggregate)

        def update(self) -> None: ...
        def get_metric(self) -> dict[str, float]:
            return {}

    with pytest.raises(ConfigurationError, match="aggregate='mean'.*sum, max, min"):
        Bad("x", aggregate="mean")
    with pytest.raises(ConfigurationError, match="already registered"):
        Bad("ok")
    with pytest.raises(ConfigurationError, match="hide the attribute"):
        Bad("reset")
    with pytest.raises(ConfigurationError, match="identifier"):
        Bad("_private")
    with pytest.raises(ConfigurationError, match="numeric"):
        Bad("x", value="zero")


def test_element_keeps_its_shape():
    m = ClassifyFPreRecMetric(num_classes=3)
    with pytest.raises(MetricInputError, match=r"shape \(3,\).*shape \(4,\)"):
        m.tp = np.zeros(4)


def test_all_reduce_that_changes_shape_is_reported():
    m = Accuracy()
    with pytest.raises(MetricInputError, match="must keep the shape"):
        m.aggregate(lambda array, op: np.zeros(3))


def test_unknown_attribute_is_an_attribute_error():
    with pytest.raises(AttributeError, match="nope"):
        Accuracy().nope  # noqa: B018


# ------------------------------------------------------------------------ Accuracy
def test_accuracy_ids_and_logits_agree():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(32, 5))
    target = rng.integers(0, 5, size=32)
    by_logits, by_ids = Accuracy(), Accuracy()
    by_logits.update(logits, target)
    by_ids.update(logits.argmax(-1), target)
    expected = float((logits.argmax(-1) == target).mean())
    assert by_logits.get_metric() == by_ids.get_metric() == {"acc": pytest.approx(expected)}


def test_accuracy_seq_len_masks_padding():
    target = np.array([[1, 2, 3, 0], [4, 5, 0, 0]])
    pred = np.array([[1, 2, 9, 9], [4, 9, 9, 9]])  # padding positions are all wrong on purpose
    m = Accuracy()
    m.update(pred, target, seq_len=np.array([3, 2]))
    assert m.get_metric() == {"acc": pytest.approx(3 / 5)}
    scores = np.eye(10)[pred]  # one-hot scores with a trailing class dim
    m2 = Accuracy()
    m2.update(scores, target, seq_len=np.array([3, 2]))
    assert m2.get_metric() == m.get_metric()


def test_accuracy_empty_is_zero_without_warning(recwarn):
    assert Accuracy().get_metric() == {"acc": 0.0}
    assert not recwarn.list


def test_accuracy_aggregates_like_one_process():
    rng = np.random.default_rng(1)
    pred, target = rng.integers(0, 3, 50), rng.integers(0, 3, 50)
    whole, a, b = Accuracy(), Accuracy(), Accuracy()
    whole.update(pred, target)
    a.update(pred[:20], target[:20])
    b.update(pred[20:], target[20:])
    both_ranks(a, b)
    assert a.get_metric() == b.get_metric() == whole.get_metric()
    assert Accuracy.result_names == ("acc",)


@pytest.mark.parametrize(
    ("pred", "target", "seq_len", "match"),
    [
        (np.zeros((4, 3)), np.zeros(5), None, r"pred has shape \(4, 3\) and target \(5,\)"),
        (np.zeros(4), np.zeros(5), None, r"pred has shape \(4,\) and target \(5,\)"),
        (np.zeros(4), np.zeros(4), np.array([1, 1, 1, 1]), "seq_len was given"),
        (np.zeros((2, 3)), np.zeros((2, 3)), np.array([1, 2, 3]), r"shape \(2,\)"),
        (np.zeros((2, 3)), np.zeros((2, 3)), np.array([1, 4]), r"in \[0, 3\]"),
    ],
)
def test_accuracy_bad_inputs(pred, target, seq_len, match):
    with pytest.raises(MetricInputError, match=match):
        Accuracy().update(pred, target, seq_len=seq_len)


# ----------------------------------------------------------- ClassifyFPreRecMetric
@pytest.mark.parametrize("f_type", ["micro", "macro"])
@pytest.mark.parametrize("beta", [1, 0.5, 2])
def test_fpr_matches_sklearn(f_type, beta):
    rng = np.random.default_rng(42)
    target = rng.integers(0, 6, size=300)
    target[target == 5] = 4  # class 5 never occurs in target ...
    pred = rng.integers(0, 5, size=300)  # ... nor in pred: macro leaves it out, as sklearn does
    m = ClassifyFPreRecMetric(num_classes=6, f_type=f_type, beta=beta, only_gross=False)
    m.update(pred[:100], target[:100])
    m.update(pred[100:], target[100:])
    got = m.get_metric()
    p, r, f, _ = precision_recall_fscore_support(target, pred, beta=beta, average=f_type, zero_division=0)
    assert (got["pre"], got["rec"], got["f"]) == pytest.approx((p, r, f))
    pc, rc, fc, _ = precision_recall_fscore_support(
        target, pred, beta=beta, average=None, labels=list(range(6)), zero_division=0
    )
    for label in range(6):
        assert got[f"pre-{label}"] == pytest.approx(pc[label])
        assert got[f"rec-{label}"] == pytest.approx(rc[label])
        assert got[f"f-{label}"] == pytest.approx(fc[label])
    assert tuple(got) == m.result_names


@pytest.mark.parametrize("f_type", ["micro", "macro"])
def test_fpr_ignore_labels_matches_sklearn_labels(f_type):
    rng = np.random.default_rng(7)
    target, pred = rng.integers(0, 4, size=200), rng.integers(0, 4, size=200)
    vocab = ["O", "PER", "LOC", "ORG"]
    m = ClassifyFPreRecMetric(tag_vocab=vocab, ignore_labels=["O"], f_type=f_type, only_gross=False)
    m.update(pred, target)
    got = m.get_metric()
    p, r, f, _ = precision_recall_fscore_support(target, pred, labels=[1, 2, 3], average=f_type, zero_division=0)
    assert (got["pre"], got["rec"], got["f"]) == pytest.approx((p, r, f))
    assert "f-O" not in got and "f-PER" in got
    assert m.result_names == ("f", "pre", "rec", "f-PER", "pre-PER", "rec-PER", "f-LOC", "pre-LOC",
                              "rec-LOC", "f-ORG", "pre-ORG", "rec-ORG")


def test_fpr_logits_seq_len_and_mapping_vocab():
    rng = np.random.default_rng(3)
    logits = rng.normal(size=(4, 7, 3))
    target = rng.integers(0, 3, size=(4, 7))
    seq_len = np.array([7, 3, 0, 5])
    m = ClassifyFPreRecMetric(tag_vocab={"a": 0, "b": 1, "c": 2}, f_type="macro")
    m.update(logits, target, seq_len=seq_len)
    mask = np.arange(7)[None, :] < seq_len[:, None]
    p, r, f, _ = precision_recall_fscore_support(
        target[mask], logits.argmax(-1)[mask], average="macro", zero_division=0
    )
    assert m.get_metric() == pytest.approx({"f": f, "pre": p, "rec": r})
    assert m.result_names == ("f", "pre", "rec")


def test_fpr_aggregates_like_one_process_and_resets():
    rng = np.random.default_rng(5)
    pred, target = rng.integers(0, 4, 90), rng.integers(0, 4, 90)
    whole, a, b = (ClassifyFPreRecMetric(num_classes=4, f_type="macro") for _ in range(3))
    whole.update(pred, target)
    a.update(pred[:33], target[:33])
    b.update(pred[33:], target[33:])
    both_ranks(a, b)
    assert a.get_metric() == b.get_metric() == pytest.approx(whole.get_metric())
    np.testing.assert_array_equal(a.tp + b.tp, 2 * whole.tp)
    whole.reset()
    assert whole.get_metric() == {"f": 0.0, "pre": 0.0, "rec": 0.0}
    assert whole.tp.tolist() == [0, 0, 0, 0]


def test_fpr_integral_float_ids_are_accepted():
    m = ClassifyFPreRecMetric(num_classes=2)
    m.update(np.array([0.0, 1.0, 1.0]), np.array([0, 1, 0]))
    assert m.tp.tolist() == [1, 1] and m.fp.tolist() == [0, 1]


@pytest.mark.parametrize(
    ("pred", "target", "match"),
    [
        (np.array([0, 1]), np.array([0, 3]), r"target holds \[3\].*\[0, 3\)"),
        (np.array([-1, 1]), np.array([0, 1]), r"pred holds \[-1\]"),
        (np.array([0.5, 1]), np.array([0, 1]), r"pred holds \[0.5\]"),
        (np.zeros((2, 4)), np.array([0, 1]), "4 classes in the last dimension.*num_classes=3"),
        (np.zeros((2, 3)), np.array([0, 1, 2]), r"pred has shape \(2, 3\) and target \(3,\)"),
    ],
)
def test_fpr_bad_inputs(pred, target, match):
    with pytest.raises(MetricInputError, match=match):
        ClassifyFPreRecMetric(num_classes=3).update(pred, target)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({}, "num_classes=<int> or tag_vocab"),
        ({"num_classes": 0}, "num_classes=0"),
        ({"num_classes": True}, "num_classes=True"),
        ({"num_classes": 3, "tag_vocab": ["a", "b"]}, "num_classes=3 but tag_vocab has 2"),
        ({"tag_vocab": "abc"}, "tag_vocab='abc'"),
        ({"tag_vocab": ["a", "a"]}, r"repeated label names \['a'\]"),
        ({"tag_vocab": {"a": 0, "b": 2}}, "ids 0..1"),
        ({"tag_vocab": []}, "empty"),
        ({"num_classes": 3, "f_type": "weighted"}, "f_type='weighted'.*micro, macro"),
        ({"num_classes": 3, "beta": 0}, "beta=0"),
        ({"num_classes": 3, "only_gross": "no"}, "only_gross='no'"),
        ({"num_classes": 3, "ignore_labels": ["O"]}, "ignore_labels contains 'O'"),
        ({"num_classes": 3, "ignore_labels": [3]}, r"ids in \[0, 3\)"),
        ({"num_classes": 2, "ignore_labels": [0, 1]}, "ignores every one"),
    ],
)
def test_fpr_bad_arguments(kwargs, match):
    with pytest.raises(ConfigurationError, match=match):
        ClassifyFPreRecMetric(**kwargs)


def test_fpr_zero_division_is_zero_without_warning(recwarn):
    m = ClassifyFPreRecMetric(num_classes=3, only_gross=False)
    m.update(np.array([0, 0]), np.array([1, 1]))  # class 0: only fp; class 1: only fn; class 2: nothing
    got = m.get_metric()
    assert got["f"] == got["pre"] == got["rec"] == 0.0
    assert got["pre-2"] == got["rec-2"] == got["f-2"] == 0.0
    assert not recwarn.list
