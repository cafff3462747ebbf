"""The score a downstream task needs, from predictions and labels (numpy only: the gate and the bootstrap call
it thousands of times). f1 is class 1's (binary tasks, as GLUE's MRPC), macro_f1 the mean over classes.

    value = score("mcc", predictions, labels, num_labels=2)
"""

from __future__ import annotations

import numpy as np

CLASSIFICATION_METRICS = ("accuracy", "f1", "macro_f1", "mcc")
REGRESSION_METRICS = ("pearson", "spearman")
METRICS = CLASSIFICATION_METRICS + REGRESSION_METRICS


def _f1_of(predictions: np.ndarray, labels: np.ndarray, cls: int) -> float:
    tp = float(np.sum((predictions == cls) & (labels == cls)))
    wrong = float(np.sum((predictions == cls) != (labels == cls)))
    return 2 * tp / (2 * tp + wrong) if tp + wrong else 0.0


def _mcc(predictions: np.ndarray, labels: np.ndarray, num_labels: int) -> float:
    """Matthews correlation for K classes (Gorodkin 2004; sklearn's matthews_corrcoef): 0 when either side
    predicts a single class."""
    confusion = np.zeros((num_labels, num_labels))
    np.add.at(confusion, (labels, predictions), 1)
    t, p, c, s = confusion.sum(1), confusion.sum(0), np.trace(confusion), confusion.sum()
    denominator = np.sqrt((s**2 - p @ p) * (s**2 - t @ t))
    return float((c * s - t @ p) / denominator) if denominator else 0.0


def _ranks(x: np.ndarray) -> np.ndarray:
    """Ranks with ties averaged (as scipy.stats.rankdata), for Spearman."""
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x))
    ranks[order] = np.arange(len(x), dtype=float)
    _, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=ranks)
    return sums[inverse] / counts[inverse]


def _pearson(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a - a.mean(), b - b.mean()
    denominator = np.sqrt((a @ a) * (b @ b))
    return float(a @ b / denominator) if denominator else 0.0


def score(metric: str, predictions: np.ndarray, labels: np.ndarray, num_labels: int) -> float:
    """`metric` of `predictions` (class ids, or values for regression) against `labels`."""
    predictions, labels = np.asarray(predictions), np.asarray(labels)
    if metric == "accuracy":
        return float(np.mean(predictions == labels))
    if metric == "f1":
        return _f1_of(predictions, labels, 1)
    if metric == "macro_f1":
        return float(np.mean([_f1_of(predictions, labels, k) for k in range(num_labels)]))
    if metric == "mcc":
        return _mcc(predictions.astype(int), labels.astype(int), num_labels)
    if metric == "pearson":
        return _pearson(predictions.astype(float), labels.astype(float))
    if metric == "spearman":
        return _pearson(_ranks(predictions.astype(float)), _ranks(labels.astype(float)))
    raise ValueError(f"unknown metric {metric!r}: one of {', '.join(METRICS)}")


def scores(predictions: np.ndarray, labels: np.ndarray, num_labels: int, regression: bool) -> dict[str, float]:
    """Every metric that applies to the task (what each fine-tuning run records)."""
    names = REGRESSION_METRICS if regression else [m for m in CLASSIFICATION_METRICS if m != "f1" or num_labels == 2]
    return {m: score(m, predictions, labels, num_labels) for m in names}
