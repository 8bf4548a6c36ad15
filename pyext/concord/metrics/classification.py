"""Classification metrics over count states updated by the C kernels.

Inputs, per task:

- ``binary``: preds (N,) probabilities (positive when >= threshold) or 0/1
  labels; target (N,) 0/1 labels.
- ``multiclass``: preds (N, C) scores (probabilities or logits; the argmax
  is the prediction) or (N,) labels in [0, C); target (N,) labels in [0, C).
- ``multilabel``: preds (N, L) probabilities or 0/1 labels, target (N, L)
  0/1; ``num_classes`` is the number of labels L.

Labels are int8/int32/int64/uint8/bool arrays; scores float16/bfloat16/
float32/float64. A wrong shape or dtype raises ValueError naming what was
expected, before the state changes; so does an out-of-range label on the
host. On a GPU the data is never read on the host: samples with an
out-of-range label (or a binary label other than 0 / 1, or an AUROC score
outside [0, 1]) are skipped, not counted.

Zero division: a per-class score whose denominator is zero (precision of a
class never predicted, recall of a class never in the target) is NaN. The
averages follow torchmetrics (and scikit-learn): ``micro`` divides the
summed counts; ``macro`` is the mean over the classes that occur (in the
target or the predictions), a zero-division class among them counting 0,
and for multilabel the mean over every label, one that occurs nowhere
counting 0; ``weighted``
weighs each class by its support (its count in the target), zero-division
classes counting 0. When an average itself has nothing to divide by (no
samples yet, or no class occurs), compute() returns NaN with a
RuntimeWarning. ``average="none"`` returns the per-class scores, NaN
entries included, without a warning, as a float64 array of the metric's
home (NumPy for NumPy inputs, torch for torch inputs, on their device).
"""

from __future__ import annotations

import operator
import warnings

import numpy as np

from .base import Metric, run_kernel, to_numpy

__all__ = ["Accuracy", "BinaryAUROC", "ConfusionMatrix", "F1Score", "FBetaScore", "Precision",
           "Recall"]

TASKS = ("binary", "multiclass", "multilabel")
AVERAGES = ("micro", "macro", "weighted", "none")
# Probabilities at or above it are positive (binary and multilabel tasks).
THRESHOLD = 0.5


def _check_task(name, task, num_classes):
    """The number of classes (labels for multilabel; 2 for binary)."""
    if task not in TASKS:
        raise ValueError(f"{name}: task must be one of {TASKS}, got {task!r}")
    if task == "binary":
        return 2
    if num_classes is None:
        raise ValueError(f"{name}: task={task!r} needs num_classes")
    num_classes = operator.index(num_classes)
    if num_classes < 1:
        raise ValueError(f"{name}: num_classes must be at least 1, got {num_classes}")
    return num_classes


def _check_scores(name, preds, num_classes):
    """Raises ValueError unless 2-D preds have num_classes columns: the
    kernels see only the columns, not the configured class count."""
    shape = tuple(preds.shape)
    if len(shape) == 2 and shape[1] != num_classes:
        raise ValueError(f"{name}: preds has shape {shape}, expected (N, {num_classes}) scores "
                         "or (N,) labels")


class _ClassCounts(Metric):
    """Per-class counts for one task, updated by the C kernels:

    - binary: "confusion" int64 [2, 2] (row = target, column = prediction);
    - multiclass: "confusion" int64 [C, C];
    - multilabel: "counts" int64 [L, 4], per label [tp, fp, fn, tn].
    """

    def __init__(self, task, num_classes, threshold):
        super().__init__()
        self.task = task
        self.num_classes = _check_task(type(self).__name__, task, num_classes)
        self.threshold = float(threshold)
        if task == "multilabel":
            self._add_state("counts", "sum", (self.num_classes, 4), np.int64)
        else:
            self._add_state("confusion", "sum", (self.num_classes,) * 2, np.int64)

    def update(self, preds, target):
        preds, target = self._begin_update(preds, target)
        if self.task == "binary":
            run_kernel("binary_confusion", self._window["confusion"], preds, target,
                       threshold=self.threshold)
        elif self.task == "multiclass":
            _check_scores(type(self).__name__, preds, self.num_classes)
            run_kernel("confusion_matrix", self._window["confusion"], preds, target)
        else:
            run_kernel("multilabel_counts", self._window["counts"], preds, target,
                       threshold=self.threshold)

    def _stats(self):
        """(tp, fp, fn, tn) per class, as float64 arrays; for binary, of the
        positive class only."""
        if self.task == "multilabel":
            return tuple(self._host("counts").T.astype(np.float64))
        cm = self._host("confusion").astype(np.float64)
        if self.task == "binary":
            return tuple(np.array([v]) for v in (cm[1, 1], cm[0, 1], cm[1, 0], cm[0, 0]))
        tp = np.diag(cm)
        fp = cm.sum(axis=0) - tp
        fn = cm.sum(axis=1) - tp
        return tp, fp, fn, cm.sum() - tp - fp - fn


class ConfusionMatrix(_ClassCounts):
    """Counts of (target, prediction) pairs, int64: (C, C) for multiclass
    and (2, 2) for binary (row = target, column = prediction); for
    multilabel (L, 2, 2), per label [[tn, fp], [fn, tp]]. An array of the
    metric's home: NumPy for NumPy inputs, torch for torch inputs (on their
    device)."""

    def __init__(self, num_classes=None, task="multiclass", threshold=THRESHOLD):
        super().__init__(task, num_classes, threshold)

    def _compute(self):
        if self.task != "multilabel":
            return self._value("confusion")  # a new array (synced + window)
        counts = self._value("counts")  # per label [tp, fp, fn, tn]
        xp = self._where.xp
        tn, fp, fn, tp = (counts[:, j] for j in (3, 1, 2, 0))
        return xp.reshape(xp.stack([tn, fp, fn, tp], axis=1), (-1, 2, 2))


class _Score(_ClassCounts):
    """A score num / den built from per-class counts, averaged as in the
    module docstring. Binary scores are those of the positive class."""

    def __init__(self, task, num_classes, threshold, average):
        super().__init__(task, num_classes, threshold)
        if average not in AVERAGES:
            raise ValueError(f"{type(self).__name__}: average must be one of {AVERAGES}, "
                             f"got {average!r}")
        self.average = average

    def _parts(self, tp, fp, fn):
        """(numerator, denominator) per class."""
        raise NotImplementedError

    def _compute(self):
        tp, fp, fn, _ = self._stats()
        num, den = self._parts(tp, fp, fn)
        if self.task == "binary":
            return self._ratio(num[0], den[0])
        if self.average == "micro":
            return self._ratio(num.sum(), den.sum())
        defined = den > 0
        scores = np.divide(num, den, out=np.full(num.shape, np.nan), where=defined)
        if self.average == "none":
            return self._to_home(scores)
        if self.average == "macro":
            weights = np.ones_like(tp) if self.task == "multilabel" else tp + fp + fn > 0
        else:
            weights = tp + fn
        weights = weights.astype(np.float64)
        return self._ratio((weights * np.where(defined, scores, 0.0)).sum(), weights.sum())


class Precision(_Score):
    """tp / (tp + fp)."""

    def __init__(self, task="multiclass", num_classes=None, average="micro", threshold=THRESHOLD):
        super().__init__(task, num_classes, threshold, average)

    def _parts(self, tp, fp, fn):
        return tp, tp + fp


class Recall(_Score):
    """tp / (tp + fn)."""

    def __init__(self, task="multiclass", num_classes=None, average="micro", threshold=THRESHOLD):
        super().__init__(task, num_classes, threshold, average)

    def _parts(self, tp, fp, fn):
        return tp, tp + fn


class FBetaScore(_Score):
    """(1 + beta^2) tp / ((1 + beta^2) tp + beta^2 fn + fp): the weighted
    harmonic mean of precision and recall (recall beta times as important)."""

    def __init__(self, beta=1.0, task="multiclass", num_classes=None, average="micro",
                 threshold=THRESHOLD):
        super().__init__(task, num_classes, threshold, average)
        if not beta > 0:
            raise ValueError(f"{type(self).__name__}: beta must be positive, got {beta}")
        self.beta = float(beta)

    def _parts(self, tp, fp, fn):
        b2 = self.beta ** 2
        return (1 + b2) * tp, (1 + b2) * tp + b2 * fn + fp


class F1Score(FBetaScore):
    """FBetaScore with beta = 1: 2 tp / (2 tp + fn + fp)."""

    def __init__(self, task="multiclass", num_classes=None, average="micro", threshold=THRESHOLD):
        super().__init__(1.0, task, num_classes, average, threshold)


class Accuracy(Metric):
    """The fraction of correct predictions (micro accuracy, as torchmetrics'
    Accuracy by default).

    - binary: (tp + tn) / N over a [2, 2] confusion state;
    - multiclass: samples whose target is among the top_k scores / N, state
      int64 [correct, N]; label preds (N,) need top_k = 1;
    - multilabel: correct (sample, label) pairs / (N * L), over per-label
      [tp, fp, fn, tn] counts.

    NaN with a RuntimeWarning before any sample."""

    def __init__(self, task="multiclass", num_classes=None, top_k=1, threshold=THRESHOLD):
        super().__init__()
        self.task = task
        self.num_classes = _check_task("Accuracy", task, num_classes)
        self.top_k = operator.index(top_k)
        self.threshold = float(threshold)
        if self.top_k != 1 and task != "multiclass":
            raise ValueError(f"Accuracy: top_k applies to task='multiclass' only, got top_k="
                             f"{self.top_k} with task={task!r}")
        if not 1 <= self.top_k <= self.num_classes:
            raise ValueError(
                f"Accuracy: top_k must be in [1, {self.num_classes}], got {self.top_k}")
        if task == "binary":
            self._add_state("confusion", "sum", (2, 2), np.int64)
        elif task == "multiclass":
            self._add_state("correct", "sum", (2,), np.int64)
        else:
            self._add_state("counts", "sum", (self.num_classes, 4), np.int64)

    def update(self, preds, target):
        preds, target = self._begin_update(preds, target)
        if self.task == "binary":
            run_kernel("binary_confusion", self._window["confusion"], preds, target,
                       threshold=self.threshold)
        elif self.task == "multilabel":
            run_kernel("multilabel_counts", self._window["counts"], preds, target,
                       threshold=self.threshold)
        elif len(preds.shape) == 2:
            _check_scores("Accuracy", preds, self.num_classes)
            run_kernel("topk_correct", self._window["correct"], preds, target, k=self.top_k)
        elif self._where.xp is np:
            self._window["correct"] += self._label_counts(to_numpy(preds), to_numpy(target))
        else:
            self._window["correct"] += self._label_counts_in_home(preds, target)

    def _check_labels(self, preds, target, is_integer):
        """Raises ValueError unless preds and target are (N,) integer labels
        (from their shapes and dtypes only)."""
        expected = f"expected (N,) labels or (N, {self.num_classes}) scores, with target (N,)"
        p_shape, t_shape = tuple(preds.shape), tuple(target.shape)
        if len(p_shape) != 1 or p_shape != t_shape:
            raise ValueError(f"Accuracy: preds has shape {p_shape} and target {t_shape}; "
                             + expected)
        if self.top_k != 1:
            raise ValueError(f"Accuracy: top_k={self.top_k} needs (N, {self.num_classes}) scores, "
                             f"got labels of shape {p_shape}")
        for role, labels in (("preds", preds), ("target", target)):
            if not is_integer(labels.dtype):
                raise ValueError(f"Accuracy: {role} labels have dtype {labels.dtype}, expected "
                                 "an integer dtype")

    def _check_range(self, preds, target):
        """Raises ValueError when NumPy labels fall outside [0, C)."""
        for role, labels in (("preds", preds), ("target", target)):
            if labels.size and not (labels.min() >= 0 and labels.max() < self.num_classes):
                raise ValueError(f"Accuracy: {role} holds labels outside [0, {self.num_classes})")

    def _label_counts(self, preds, target):
        """[correct, N] of NumPy label predictions, checked like the kernels check."""
        self._check_labels(preds, target, lambda dtype: dtype.kind in "iub")
        self._check_range(preds, target)
        return np.array([np.count_nonzero(preds == target), preds.size], np.int64)

    def _label_counts_in_home(self, preds, target):
        """[correct, N] of label predictions of the home's namespace, as an
        array of the home, computed there: on the host the labels are
        checked as the kernels check them; on a device their values are not
        read (no host synchronisation) and, as in the kernels, samples with
        a label outside [0, C) are skipped."""
        xp = self._where.xp
        self._check_labels(preds, target,
                           lambda dtype: xp.isdtype(dtype, ("bool", "signed integer",
                                                            "unsigned integer")))
        if self._where.on_host:
            self._check_range(to_numpy(preds), to_numpy(target))
        return self._count_labels(xp, preds, target)

    def _count_labels(self, xp, preds, target):
        p, t = xp.astype(preds, xp.int64), xp.astype(target, xp.int64)
        valid = (p >= 0) & (p < self.num_classes) & (t >= 0) & (t < self.num_classes)
        correct = xp.sum(xp.astype(valid & (p == t), xp.int64))
        return xp.stack([correct, xp.sum(xp.astype(valid, xp.int64))])

    def _compute(self):
        if self.task == "binary":
            cm = self._host("confusion")
            return self._ratio(np.trace(cm), cm.sum())
        if self.task == "multiclass":
            correct, total = self._host("correct")
            return self._ratio(correct, total)
        counts = self._host("counts")
        return self._ratio(counts[:, 0].sum() + counts[:, 3].sum(), counts.sum())


class BinaryAUROC(Metric):
    """Area under the ROC curve of binary scores in [0, 1], from a histogram
    of `num_bins` equal bins per class (state int64 [2, num_bins]: negatives,
    positives), by the trapezoid rule over the bin edges. Scores in one bin
    count as ties, so the result equals the exact AUROC of the binned scores
    and is within about 1/num_bins of the exact one. With no positives or no
    negatives it is 0.5, with a RuntimeWarning."""

    def __init__(self, num_bins=10000):
        super().__init__()
        self.num_bins = operator.index(num_bins)
        if self.num_bins < 1:
            raise ValueError(f"BinaryAUROC: num_bins must be at least 1, got {self.num_bins}")
        self._add_state("histogram", "sum", (2, self.num_bins), np.int64)

    def update(self, preds, target):
        """preds (N,) scores in [0, 1]; target (N,) 0/1 labels."""
        preds, target = self._begin_update(preds, target)
        run_kernel("binary_histogram", self._window["histogram"], preds, target)

    def _compute(self):
        negatives, positives = self._host("histogram").astype(np.float64)
        n_pos, n_neg = positives.sum(), negatives.sum()
        if n_pos == 0 or n_neg == 0:
            warnings.warn("BinaryAUROC.compute(): the data has no positives or no negatives; "
                          "returning 0.5", RuntimeWarning, stacklevel=3)
            return 0.5
        # Sweeping the threshold down bin by bin, each bin's negatives move
        # the false-positive rate across a trapezoid whose heights are the
        # true-positive rates before and after the bin's positives.
        tp_after = np.cumsum(positives[::-1])
        tp_before = tp_after - positives[::-1]
        area = (negatives[::-1] * (tp_before + tp_after) / 2).sum()
        return float(area / (n_pos * n_neg))
