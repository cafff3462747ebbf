"""How far a downstream score can be trusted, and whether two scores differ by more than their noise: a
bootstrap over seeds and examples from a fixed seed (docs/releases.md#how-downstream-scores-are-made).

    lo, hi = interval("accuracy", predictions, labels, num_labels)            # predictions: seeds x examples
    diff, lo, hi = paired_difference("accuracy", candidate, published, labels, num_labels)
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from statistics import NormalDist

import numpy as np

from mlm_tasks.downstream.metrics import score

ROUNDS = 1000
LEVEL = 0.95  # the intervals' coverage, everywhere they are shown and used
Z = NormalDist().inv_cdf(0.5 + LEVEL / 2)  # LEVEL's normal quantile (1.96)
BOOTSTRAP_SEED = 0


def _percentiles(values: np.ndarray) -> tuple[float, float]:
    tail = (1 - LEVEL) / 2 * 100
    lo, hi = np.percentile(values, [tail, 100 - tail])
    return float(lo), float(hi)


def interval(
    metric: str, predictions: Sequence[Sequence[float]], labels: Sequence[float], num_labels: int
) -> tuple[float, float]:
    """The 95% interval of the seeds' mean score, bootstrapping the seeds and the evaluation examples."""
    preds, y = np.asarray(predictions), np.asarray(labels)
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    seeds, n = int(preds.shape[0]), int(preds.shape[1])
    rounds = np.empty(ROUNDS)
    for r in range(ROUNDS):
        rows, idx = rng.integers(seeds, size=seeds), rng.integers(n, size=n)
        rounds[r] = np.mean([score(metric, preds[s, idx], y[idx], num_labels) for s in rows])
    return _percentiles(rounds)


def paired_difference(
    metric: str,
    candidate: Sequence[Sequence[float]],
    baseline: Sequence[Sequence[float]],
    labels: Sequence[float],
    num_labels: int,
) -> tuple[float, float, float]:
    """candidate - baseline (means over their seeds) on the same examples, and its 95% interval: each
    round draws one set of examples for both and each side's seeds."""
    a, b, y = np.asarray(candidate), np.asarray(baseline), np.asarray(labels)
    rng = np.random.default_rng(BOOTSTRAP_SEED)

    def mean_score(preds: np.ndarray, rows: np.ndarray, idx: np.ndarray) -> float:
        return float(np.mean([score(metric, preds[s, idx], y[idx], num_labels) for s in rows]))

    everything = np.arange(len(y))
    diff = mean_score(a, np.arange(len(a)), everything) - mean_score(b, np.arange(len(b)), everything)
    rounds = np.empty(ROUNDS)
    for r in range(ROUNDS):
        idx = rng.integers(len(y), size=len(y))
        rows_a, rows_b = rng.integers(len(a), size=len(a)), rng.integers(len(b), size=len(b))
        rounds[r] = mean_score(a, rows_a, idx) - mean_score(b, rows_b, idx)
    return (diff, *_percentiles(rounds))


def unpaired_difference(
    mean: float, bounds: Sequence[float], baseline_mean: float, baseline_bounds: Sequence[float]
) -> tuple[float, float, float]:
    """mean - baseline_mean and its 95% interval from the two intervals alone (normal approximation, the
    two scores independent): for scores on different examples, or a baseline published without predictions."""
    se = np.hypot((bounds[1] - bounds[0]) / (2 * Z), (baseline_bounds[1] - baseline_bounds[0]) / (2 * Z))
    diff = mean - baseline_mean
    return diff, float(diff - Z * se), float(diff + Z * se)


def examples_fingerprint(texts: Sequence[str], pairs: Sequence[str] | None, labels: Sequence[float]) -> str:
    """What the scored examples were: two runs' predictions pair up only on the same examples in the same order."""
    blob = json.dumps([list(texts), list(pairs) if pairs is not None else None, [float(v) for v in labels]])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def half_width_for(n: int) -> float:
    """The widest half-interval an accuracy on n examples can have (p = 0.5, one seed, normal approximation):
    what a task of n evaluation examples can resolve at best, before any fine-tuning is paid for."""
    return Z * 0.5 / np.sqrt(max(n, 1))
